"""recompute-harness: regression tests and golden baselines for activation recompute."""

__version__ = "0.1.0"
