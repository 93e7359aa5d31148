"""Scoring: pure numpy functions from run directories to the paper's numbers."""
