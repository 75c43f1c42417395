"""A row's effect against the matched ``[]`` control of the same set, at one peak scope.

The skill's measurement contract: peaks from different jobs are not comparable, the matched control
is. A row's effect (saving, reserved change, step-time cost, TFLOP/s change) is read against the
control of its own sweep, at the same checkpoint (the iteration the peaks were read after) and over
the same ranks (the peak scope), so machine-wide drift cancels. Goldens store effects, the
comparator judges them, the analysis ranks by them: this module is their one definition.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.errors import UsageError
from harness.record.metrics import MetricName
from harness.record.model import Number, Record, RunMetrics
from harness.record.vocabulary import MEASURED_PEAK_SCOPES

# Whose peak a number is (harness.record.vocabulary.PeakScope, less "unreported").
SCOPES = MEASURED_PEAK_SCOPES
SCOPED_METRICS = {
    MetricName.PEAK_ALLOCATED_BYTES: ("at", "allocated"),
    MetricName.PEAK_RESERVED_BYTES: ("at", "reserved"),
    MetricName.RUN_PEAK_ALLOCATED_BYTES: ("last", "allocated"),
    MetricName.RUN_PEAK_RESERVED_BYTES: ("last", "reserved"),
}


def is_control(record: Record) -> bool:
    """The skill's matched no-recompute control: selective granularity with an empty module list."""
    return record.recompute.is_control


def completed(record: Record) -> bool:
    """A pass: completed through several steady steps, with a measured step time and no NaN iterations."""
    metrics = record.run_metrics
    window = metrics.steady_window
    return (
        record.outcome.status == "completed"
        and metrics.headline[MetricName.STEP_TIME_MS] is not None
        and window is not None
        and window.last > window.first
        and not metrics.nan_iterations
    )


def data_parallel_rank(rank: int, record: Record) -> int:
    """``rank``'s data-parallel rank under Megatron Core's default order (tp-cp-ep-dp-pp)."""
    layout = record.workload.parallelism
    return (rank // (layout.tp * layout.cp)) % layout.dp


def _ranks_in(scope: str, record: Record) -> list[int]:
    ranks = [rank.rank for rank in record.run_metrics.ranks]
    if scope == "rank0":
        return [rank for rank in ranks if rank == 0]
    if scope == "dp-rank0":
        return [rank for rank in ranks if data_parallel_rank(rank, record) == 0]
    return ranks


def scoped_peaks(record: Record, scope: str) -> dict[str, Number | None]:
    """The record's peak metrics over the ranks ``scope`` names; refused when the record cannot say."""
    headline = record.headline
    if headline.peak_scope in (scope, "unreported"):  # its own scope, or no peaks at all (CPU)
        return {name: headline[name] for name in SCOPED_METRICS if name in headline.values}
    metrics: RunMetrics = record.run_metrics
    chosen = set(_ranks_in(scope, record))
    if not metrics.ranks or not chosen:
        raise UsageError(
            f"record {record.id}: its peaks are {headline.peak_scope!r}, and without per-rank "
            f"peaks it cannot give the {scope!r} peak the golden holds"
        )
    at, iterations = (
        headline[MetricName.PEAK_AFTER_ITERATION],
        [{r.iteration for r in rank.peaks} for rank in metrics.ranks],
    )
    last = max(set.intersection(*iterations)) if iterations else None
    values: dict[str, Number | None] = {}
    for name, (when, kind) in SCOPED_METRICS.items():
        if name not in headline.values:
            continue
        iteration = at if when == "at" else last
        readings = (
            [rank.at(int(iteration)) for rank in metrics.ranks if rank.rank in chosen]
            if iteration
            else []
        )
        picked = [getattr(r, f"{kind}_bytes") for r in readings if r is not None]
        values[name] = None if not picked or None in picked else max(picked)
    return values


def _pct(value: Number | None, base: Number | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base * 100.0


def effects(
    row: Record, control: Record, scope: str | None = None, *, peaks: bool = True
) -> dict[str, Number | None]:
    """``row``'s effect metrics against ``control`` (registry scope ``effect``); empty for the control.

    Peaks count only when read after the same iteration in the same scope (``peaks=False``: the
    caller knows they are not comparable); times only when both rows completed their steady window.
    """
    if row is control:
        return {}
    result: dict[str, Number | None] = {}
    same_checkpoint = (
        peaks
        and row.headline[MetricName.PEAK_AFTER_ITERATION]
        == control.headline[MetricName.PEAK_AFTER_ITERATION]
    )
    scope = scope or control.headline.peak_scope
    mine, base = (
        (scoped_peaks(row, scope), scoped_peaks(control, scope)) if same_checkpoint else ({}, {})
    )
    allocated, base_allocated = (
        mine.get(MetricName.PEAK_ALLOCATED_BYTES),
        base.get(MetricName.PEAK_ALLOCATED_BYTES),
    )
    if same_checkpoint and allocated is not None and base_allocated is not None:
        result[MetricName.SAVING_ALLOCATED_BYTES] = base_allocated - allocated
        growth_pct = _pct(allocated, base_allocated)  # None when the control held nothing
        result[MetricName.SAVING_ALLOCATED_PCT] = None if growth_pct is None else -growth_pct
    if same_checkpoint:
        result[MetricName.RESERVED_CHANGE_PCT] = _pct(
            mine.get(MetricName.PEAK_RESERVED_BYTES), base.get(MetricName.PEAK_RESERVED_BYTES)
        )
    if completed(row) and completed(control):
        result[MetricName.STEP_TIME_COST_PCT] = _pct(
            row.headline[MetricName.STEP_TIME_MS], control.headline[MetricName.STEP_TIME_MS]
        )
        result[MetricName.TFLOPS_CHANGE_PCT] = _pct(
            row.headline[MetricName.TFLOPS_PER_GPU], control.headline[MetricName.TFLOPS_PER_GPU]
        )
    return {name: value for name, value in result.items() if value is not None}


def matched_control(records: Sequence[Record]) -> Record | None:
    """The set's ``[]`` control (at most one: the loader refuses a configuration measured twice)."""
    return next(
        (record for record in records if record.kind != "cpu-probe" and is_control(record)), None
    )
