"""Every metric the harness records, judges or reports, declared once.

A ``Metric`` says what the number is (unit, which direction is better), where a record holds it
(``scope``), whether it may be null, and how a new golden judges it by default (per record kind). The
record schema, the golden's row values, the comparator's direction, the reports' formatting and the
default tolerance policy are all derived from ``METRICS``; a golden keeps its own copy of the policy,
so tuning one recipe is an edit of its golden, never of this file.

Headline metrics that are a function of the per-rank peaks carry that function (``from_ranks``): the
record builder computes them with it and the schema recomputes them to refuse hand edits, so adding
such a metric is one entry here and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Scope = Literal["headline", "count", "per-iteration", "per-rank", "probe"]
Better = Literal["lower", "higher", "exact"]
# Record kinds whose goldens judge run metrics; CPU probes are judged exactly on every metric.
RUN_KINDS = ("run", "reference")


@dataclass(frozen=True)
class Tolerance:
    """``relative``: |actual - golden| <= rel * |golden|, two-sided; ``exact``: deterministic values."""

    mode: Literal["relative", "exact"]
    rel: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode} if self.mode == "exact" else {"mode": self.mode, "rel": self.rel}


EXACT = Tolerance("exact")


def relative(rel: float) -> Tolerance:
    return Tolerance("relative", rel)


# Per rank: {iteration: (allocated_bytes, reserved_bytes | None)} read after that iteration's optimizer step.
RankReadings = Sequence[Mapping[int, tuple[int, int | None]]]
# (readings of every rank, the headline iteration, the last iteration every rank reported) -> value
FromRanks = Callable[[RankReadings, int | None, int | None], int | None]


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # "bytes", "ms", "TFLOP/s", "iterations", "FLOPs", "ops", "values", "count"
    better: Better
    scope: Scope
    description: str
    nullable: bool = True
    required: bool = True  # the schema demands the key (optional ones are newer than schema v1's first files)
    golden: bool = True  # a golden row holds it
    tolerance: Tolerance = EXACT  # default for new run/reference goldens
    from_ranks: FromRanks | None = field(default=None, compare=False)


def _hottest_allocated(readings: RankReadings, at: int | None) -> int | None:
    return None if at is None or not readings else max(rank[at][0] for rank in readings)


def _max_reserved(readings: RankReadings, at: int | None) -> int | None:
    if at is None or not readings:
        return None
    reserved = [rank[at][1] for rank in readings]
    return None if None in reserved else max(reserved)


def _allocated_spread(readings: RankReadings, at: int | None) -> int | None:
    if at is None or not readings:
        return None
    allocated = [rank[at][0] for rank in readings]
    return max(allocated) - min(allocated)


METRICS: tuple[Metric, ...] = (
    # --- headline: what a run's verdict is made on (docs/run-record.md) -----------------------------
    Metric("peak_allocated_bytes", "bytes", "lower", "headline",
           "hottest rank's max_memory_allocated() after the headline iteration", tolerance=relative(0.02),
           from_ranks=lambda readings, at, last: _hottest_allocated(readings, at)),
    Metric("peak_reserved_bytes", "bytes", "lower", "headline",
           "max over ranks of max_memory_reserved() after the headline iteration", tolerance=relative(0.05),
           from_ranks=lambda readings, at, last: _max_reserved(readings, at)),
    Metric("peak_after_iteration", "iterations", "exact", "headline",
           "the iteration the headline peaks were read after (2, or the last every rank reported)"),
    Metric("run_peak_allocated_bytes", "bytes", "lower", "headline",
           "hottest rank's allocated peak after the last iteration every rank reported (the run's peak)",
           required=False, tolerance=relative(0.02),
           from_ranks=lambda readings, at, last: _hottest_allocated(readings, last)),
    Metric("run_peak_reserved_bytes", "bytes", "lower", "headline",
           "max over ranks of the reserved peak after the last iteration every rank reported",
           required=False, tolerance=relative(0.05),
           from_ranks=lambda readings, at, last: _max_reserved(readings, last)),
    Metric("peak_allocated_spread_bytes", "bytes", "lower", "headline",
           "hottest minus coolest rank's allocated peak after the headline iteration (routing imbalance)",
           required=False, golden=False,
           from_ranks=lambda readings, at, last: _allocated_spread(readings, at)),
    Metric("step_time_ms", "ms", "lower", "headline", "mean step time over the steady window",
           tolerance=relative(0.05)),
    Metric("tflops_per_gpu", "TFLOP/s", "higher", "headline", "mean TFLOP/s per GPU over the steady window",
           tolerance=relative(0.05)),
    # --- counts over the whole run ---------------------------------------------------------------------
    Metric("skipped_iterations", "iterations", "exact", "count", "iterations the optimizer skipped"),
    Metric("nan_iterations", "iterations", "exact", "count", "iterations with a NaN/inf loss"),
    # --- per iteration (metrics.iterations[]) ----------------------------------------------------------
    Metric("step_time_ms", "ms", "lower", "per-iteration", "slowest rank's step time", golden=False),
    Metric("loss", "loss", "exact", "per-iteration", "rank 0's world-reduced loss (null when NaN)", golden=False),
    Metric("tflops_per_gpu", "TFLOP/s", "higher", "per-iteration", "mean over ranks", golden=False),
    # --- per rank (metrics.ranks[].peaks[]) -------------------------------------------------------------
    Metric("allocated_bytes", "bytes", "lower", "per-rank", "max_memory_allocated() after the iteration",
           nullable=False, golden=False),
    Metric("reserved_bytes", "bytes", "lower", "per-rank", "max_memory_reserved() after the iteration",
           golden=False),
    # --- CPU probe rows: deterministic counts, compared exactly ------------------------------------------
    Metric("retained_bytes", "bytes", "lower", "probe", "bytes autograd saved for backward", nullable=False),
    Metric("backward_flops", "FLOPs", "lower", "probe", "FLOPs of backward, replays included", nullable=False),
    Metric("replay_bytes", "bytes", "lower", "probe", "bytes recomputed during backward", nullable=False),
    Metric("replay_ops", "ops", "lower", "probe", "operators replayed during backward", nullable=False,
           required=False),
    Metric("not_bitwise_values", "values", "exact", "probe",
           "loss and gradients not bit-identical to the control's", nullable=False, required=False),
    Metric("dropout_not_bitwise_values", "values", "exact", "probe",
           "the same with dropout on (RNG replay)", nullable=False, required=False),
)


def metrics_in(scope: Scope) -> tuple[Metric, ...]:
    return tuple(metric for metric in METRICS if metric.scope == scope)


def metric(name: str, scope: Scope | None = None) -> Metric | None:
    """The metric called ``name`` (in ``scope`` when given; else the first declared)."""
    return next((m for m in METRICS if m.name == name and (scope is None or m.scope == scope)), None)


# A golden row of a run or reference record holds these, in this order.
RUN_GOLDEN_METRICS: tuple[str, ...] = tuple(
    m.name for m in METRICS if m.golden and m.scope in ("headline", "count")
)


def higher_is_better(name: str) -> bool:
    found = metric(name)
    return found is not None and found.better == "higher"


def unit_of(name: str) -> str | None:
    found = metric(name)
    return None if found is None else found.unit


def default_tolerance_policy(kind: str) -> dict[str, dict[str, Any]]:
    """The per-metric rules a new golden of ``kind`` starts from (CPU probes: ``*`` = exact)."""
    if kind not in RUN_KINDS:
        return {"*": EXACT.as_dict()}
    return {name: metric(name).tolerance.as_dict() for name in RUN_GOLDEN_METRICS}
