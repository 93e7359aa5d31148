"""Audit and report: arrange numbers computed by the scoring package into tables, figures and HTML."""
