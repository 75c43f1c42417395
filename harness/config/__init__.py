"""Configuration: revision identity, the recompute fields, label discovery and validation."""
