"""Per-label CPU measurements: plan → measure → classify → table / records / goldens."""
