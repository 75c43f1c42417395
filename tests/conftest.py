"""Shared test set-up: Hypothesis profiles and the GPU-tier skip rules."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# HYPOTHESIS_PROFILE=ci (default: derandomized, no deadline) | dev | nightly (>=100k examples/property)
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=200,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=500)
settings.register_profile(
    "nightly", deadline=None, max_examples=100_000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def golden_check(record_property):
    """One-call golden check: ``golden_check(records)`` compares with the golden of the records' own
    recipe × hardware × revision pins under the golden root and records JUnit properties."""
    from harness.record.golden_dir import golden_root
    from harness.testing import check_against_golden

    def check(records, golden=None):
        return check_against_golden(records, golden_root() if golden is None else golden, record_property)

    return check
