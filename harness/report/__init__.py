"""Reports: markdown (terminal + $GITHUB_STEP_SUMMARY), JSON, JUnit properties, PNG plot."""
