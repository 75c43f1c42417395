"""Comparison of run records: against goldens (comparator), against the [] control (analysis), selection."""
