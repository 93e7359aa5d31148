"""Benchmarks: one module (or package) per benchmark, registered in :mod:`uqh.domains.registry`."""
