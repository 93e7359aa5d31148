"""Benchmarks: one module (or package) per benchmark, registered in :mod:`uqh.domains.domain_registry`."""
