"""The metric registry: one declaration per metric, and everything else derived from it."""

from __future__ import annotations

import pytest
from record_samples import run_json, run_record

from harness.errors import UsageError
from harness.golden.format import golden_from_records
from harness.record.metrics import (
    EFFECT_METRICS,
    METRICS,
    RUN_GOLDEN_METRICS,
    default_tolerance_policy,
    metric,
    metrics_in,
)
from harness.record.model import validate_record


def test_every_metric_is_declared_once_per_scope():
    keys = [(m.name, m.scope) for m in METRICS]
    assert len(keys) == len(set(keys))
    assert all(
        m.tolerance.mode == "exact" or (m.tolerance.rel or m.tolerance.abs) > 0 for m in METRICS
    )


def test_default_policy_and_golden_rows_come_from_the_registry():
    policy = default_tolerance_policy("run")
    assert list(policy) == list(RUN_GOLDEN_METRICS)
    assert list(default_tolerance_policy("run", effects=True)) == [
        *EFFECT_METRICS,
        *RUN_GOLDEN_METRICS,
    ]
    assert policy["step_time_ms"] == {
        "mode": "relative",
        "rel": metric("step_time_ms").tolerance.rel,
    }
    golden = golden_from_records([run_record()], {"source": "test"})
    assert set(golden.rows[0].values) <= set(RUN_GOLDEN_METRICS)
    assert default_tolerance_policy("cpu-probe") == {"*": {"mode": "exact"}}


def test_a_rank_derived_headline_metric_is_computed_and_checked_by_its_registry_entry():
    # The per-rank spread of the allocated peak: declared in the registry alone (with its from_ranks).
    record = run_record(gpus=3)
    spread = record.headline["peak_allocated_spread_bytes"]
    peaks = [rank.at(2).allocated_bytes for rank in record.run_metrics.ranks]
    assert spread == max(peaks) - min(peaks) == 2000
    edited = run_json(gpus=3)
    edited["metrics"]["headline"]["peak_allocated_spread_bytes"] = 0
    with pytest.raises(
        UsageError, match="peak_allocated_spread_bytes: 0 is not what the per-rank peaks give"
    ):
        validate_record(edited)


def test_records_written_before_an_optional_metric_existed_still_load():
    older = run_json()
    for name in (m.name for m in metrics_in("headline") if not m.required):
        del older["metrics"]["headline"][name]
    assert validate_record(older) is older


def _carried_record(after_zero_grad: list[int | None]) -> dict:
    """A two-rank run whose ranks report memory_allocated() after the step and after zero_grad."""
    from harness.record.build import rank_peaks, run_metrics

    record = run_record(gpus=2)
    ranks = [
        rank_peaks(
            r,
            {
                i: (30_000_000_000, 31_000_000_000, 9_000_000_000 + r, after_zero_grad[r])
                for i in range(1, 7)
            },
        )
        for r in range(2)
    ]
    record.metrics = run_metrics(record.run_metrics.iterations, ranks, (3, 6))
    return record.to_json()


def test_carried_allocated_bytes_is_the_hottest_rank_after_zero_grad_and_checked_against_the_ranks():
    data = _carried_record([4_000_000_000, 4_000_000_500])
    assert data["metrics"]["headline"]["carried_allocated_bytes"] == 4_000_000_500
    assert (
        data["metrics"]["ranks"][0]["peaks"][1]["allocated_after_zero_grad_bytes"] == 4_000_000_000
    )
    assert validate_record(data) is data
    data["metrics"]["headline"]["carried_allocated_bytes"] = 1
    with pytest.raises(
        UsageError, match="carried_allocated_bytes: 1 is not what the per-rank peaks give"
    ):
        validate_record(data)


def test_carried_allocated_bytes_falls_back_to_after_the_step_when_zero_grad_is_not_read():
    # Bridge zeroes gradients at the next step's start: its ranks report only the after-step reading.
    data = _carried_record([None, None])
    assert data["metrics"]["headline"]["carried_allocated_bytes"] == 9_000_000_001
    assert "allocated_after_zero_grad_bytes" not in data["metrics"]["ranks"][0]["peaks"][0]
    assert validate_record(data) is data


def test_records_without_the_between_iteration_readings_have_no_carried_headline():
    data = run_json()
    assert data["metrics"]["headline"]["carried_allocated_bytes"] is None
    assert not any(
        key.startswith("allocated_after")
        for rank in data["metrics"]["ranks"]
        for peak in rank["peaks"]
        for key in peak
    )


def test_the_between_iteration_readings_survive_a_load():
    from harness.record.model import Record

    data = _carried_record([4_000_000_000, None])
    loaded = Record.from_json(data)
    assert loaded.run_metrics.ranks[0].at(2).allocated_after_zero_grad_bytes == 4_000_000_000
    assert loaded.to_json() == data
