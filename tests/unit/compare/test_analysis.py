"""Analysis rules on measured-style records: what counts as a saving, a pass, a matched set."""

from __future__ import annotations

import copy

import pytest
from record_samples import REVISIONS, run_record

from harness.compare.analysis import analyse
from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.record.build import (
    cpu_probe_metrics,
    hardware,
    iteration_row,
    new_record,
    outcome,
    parallelism,
    rank_peaks,
    run_metrics,
    workload,
)


def _rows(analysis):
    return {row.label: row for row in analysis.rows}


def _with_reserved(record, reserved):
    for rank in record.run_metrics.ranks:
        for peak in rank.peaks:
            peak.reserved_bytes = reserved
    record.headline.values["peak_reserved_bytes"] = record.headline.values[
        "run_peak_reserved_bytes"
    ] = reserved
    return record.validated()


def test_reserved_drop_alone_is_allocator_caching_not_a_saving():
    control = _with_reserved(run_record(), 40_000_000_000)
    cached = _with_reserved(run_record("core_attn", step_ms=420.0), 36_000_000_000)
    row = _rows(analyse([control, cached]))["core_attn"]
    assert (
        row.rank is None
        and "allocator caching" in row.note
        and row.reserved_vs_control_pct == pytest.approx(-10.0)
    )


def test_later_failure_than_the_control_is_advanced_but_failed():
    control = run_record(status="oom", died_in=2)  # died in the forward of iteration 2
    later = run_record("moe_act", status="oom", died_in=3)
    assert _rows(analyse([control, later]))["moe_act"].verdict == "advanced-but-failed"
    earlier = copy.deepcopy(later)
    earlier.outcome.iteration, earlier.outcome.phase = 2, "model-build"
    assert _rows(analyse([control, earlier.validated()]))["moe_act"].verdict == "failed"


def test_recorded_advanced_but_failed_status_and_nan_iterations_are_never_a_pass():
    control = run_record()
    advanced = run_record("moe_act", peak=20_000_000_000)
    advanced.outcome.status = "advanced-but-failed"
    nan_row = run_record("layernorm", peak=20_000_000_000)
    nan_row.run_metrics.iterations[3] = iteration_row(4, step_time_ms=400.0, loss=float("nan"))
    nan_row.metrics = run_metrics(nan_row.run_metrics.iterations, nan_row.run_metrics.ranks, (3, 6))
    rows = _rows(analyse([control, advanced.validated(), nan_row.validated()]))
    assert rows["moe_act"].verdict != "pass" and rows["layernorm"].verdict == "failed"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model": "other"}, "model"),
        ({"gpus": 4}, "parallelism.dp"),
    ],
)
def test_unmatched_records_are_refused_naming_the_difference(change, named):
    with pytest.raises(UsageError, match=named):
        analyse([run_record(), run_record("moe_act", **change)])


def test_pins_must_match_for_a_matched_set():
    bumped = copy.deepcopy(REVISIONS)
    bumped["torch"] = "2.15.0"
    with pytest.raises(UsageError, match="revisions.torch"):
        analyse([run_record(), run_record("moe_act", revisions=bumped)])


def test_cpu_probe_records_are_not_analysed_as_runs():
    probe = new_record(
        "cpu-probe",
        revisions=REVISIONS,
        hardware=hardware("cpu", 0, host="h"),
        workload=workload(
            recipe="cpu",
            model="tiny",
            backend="cpu-probe",
            seq_length=8,
            micro_batch_size=1,
            global_batch_size=1,
            precision="fp32",
            attention_backend="local",
            train_iters=None,
            parallelism=parallelism(),
        ),
        recompute=RecomputeFields.selective("core_attn"),
        metrics=cpu_probe_metrics(retained_bytes=1, backward_flops=2, replay_bytes=3),
        outcome=outcome("completed"),
    )
    with pytest.raises(UsageError, match="CPU-probe"):
        analyse([probe])


def test_headline_must_agree_with_per_rank_peaks():
    record = run_record()
    record.headline.values["peak_allocated_bytes"] += 1
    with pytest.raises(UsageError, match="hottest rank"):
        record.validated()


def test_ranks_are_taken_over_every_rank():
    rows = [iteration_row(i, step_time_ms=1.0) for i in range(1, 4)]
    ranks = [
        rank_peaks(0, {1: (5, 5), 2: (5, 5), 3: (5, 5)}),
        rank_peaks(7, {1: (9, 9), 2: (9, 9), 3: (9, 9)}),
    ]
    assert run_metrics(rows, ranks, (2, 3)).headline.peak_rank == 7
