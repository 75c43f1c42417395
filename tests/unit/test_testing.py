"""The one-call golden check for tests (harness.testing) and the plugin fixture that wraps it."""

from __future__ import annotations

import copy

import pytest
from record_samples import REVISIONS, refresh, run_record

from harness.golden.seed import RECORDS_DIR
from harness.testing import check_against_golden


def test_check_against_golden_records_junit_properties_and_raises_with_the_table(tmp_path):
    assert refresh(tmp_path, run_record()) == 0
    properties: list[tuple[str, object]] = []
    check_against_golden(
        [run_record()], tmp_path / "golden", lambda k, v: properties.append((k, v))
    )
    recorded = dict(properties)
    assert str(recorded["golden.[].peak_allocated_bytes"]).startswith(
        "pass: golden=30.000 GB actual=30.000 GB"
    )
    assert str(recorded["golden.[].step_time_ms"]).startswith("pass: golden=400.00 actual=400.00")
    with pytest.raises(AssertionError, match=r"FAIL: regressed"):
        check_against_golden([run_record(step_ms=500.0)], tmp_path / "golden")
    bumped = copy.deepcopy(REVISIONS)
    bumped["torch"] = "2.15.0"
    with pytest.raises(AssertionError, match="no golden .* for these revision pins"):
        check_against_golden([run_record(revisions=bumped)], tmp_path / "golden")


def test_recompute_golden_fixture_passes_on_the_seed_records(recompute_golden):
    # The plugin's fixture (harness/pytest_plugin.py), taking a record path as a foreign repo would.
    comparison = recompute_golden.check([RECORDS_DIR / "seed-moonlight-full-8gpu.json"])
    # the control: outcome + 7 absolute metrics; each other row: outcome + 3 effects + 2 counts
    assert comparison.passed and len(comparison.checks) == 8 + 5 * 6
