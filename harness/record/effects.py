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
from harness.record.model import Number, Record, RunMetrics
from harness.record.vocabulary import MEASURED_PEAK_SCOPES

# Whose peak a number is (harness.record.vocabulary.PeakScope, less "unreported").
SCOPES = MEASURED_PEAK_SCOPES
SCOPED_METRICS = {
    "peak_allocated_bytes": ("at", "allocated"),
    "peak_reserved_bytes": ("at", "reserved"),
    "run_peak_allocated_bytes": ("last", "allocated"),
    "run_peak_reserved_bytes": ("last", "reserved"),
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
        and metrics.headline["step_time_ms"] is not None
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
        headline["peak_after_iteration"],
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
        peaks and row.headline["peak_after_iteration"] == control.headline["peak_after_iteration"]
    )
    scope = scope or control.headline.peak_scope
    mine, base = (
        (scoped_peaks(row, scope), scoped_peaks(control, scope)) if same_checkpoint else ({}, {})
    )
    allocated, base_allocated = mine.get("peak_allocated_bytes"), base.get("peak_allocated_bytes")
    if same_checkpoint and allocated is not None and base_allocated is not None:
        result["saving_allocated_bytes"] = base_allocated - allocated
        growth_pct = _pct(allocated, base_allocated)  # None when the control held nothing
        result["saving_allocated_pct"] = None if growth_pct is None else -growth_pct
    if same_checkpoint:
        result["reserved_change_pct"] = _pct(
            mine.get("peak_reserved_bytes"), base.get("peak_reserved_bytes")
        )
    if completed(row) and completed(control):
        result["step_time_cost_pct"] = _pct(
            row.headline["step_time_ms"], control.headline["step_time_ms"]
        )
        result["tflops_change_pct"] = _pct(
            row.headline["tflops_per_gpu"], control.headline["tflops_per_gpu"]
        )
    return {name: value for name, value in result.items() if value is not None}


def matched_control(records: Sequence[Record]) -> Record | None:
    """The set's ``[]`` control (at most one: the loader refuses a configuration measured twice)."""
    return next(
        (record for record in records if record.kind != "cpu-probe" and is_control(record)), None
    )
