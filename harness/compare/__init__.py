"""Run records against the [] control: the analysis, and selection (against goldens: ``harness.golden.judge``)."""
