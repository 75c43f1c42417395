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
from enum import StrEnum
from typing import Any, Literal

from harness.record.vocabulary import RUN_KIND_VALUES

Scope = Literal["headline", "count", "per-iteration", "per-rank", "probe", "effect"]
Better = Literal["lower", "higher", "exact"]
# Record kinds whose goldens judge run metrics; CPU probes are judged exactly on every metric.
RUN_KINDS = RUN_KIND_VALUES


class MetricName(StrEnum):
    """Every metric's name, declared once: code names a metric by member (``MetricName.STEP_TIME_MS``),
    never by a string, so a misspelt metric fails the type checker, not a run. A member equals its
    JSON string, so records and goldens stay plain JSON."""

    ALLOCATED_AFTER_STEP_BYTES = "allocated_after_step_bytes"
    ALLOCATED_AFTER_ZERO_GRAD_BYTES = "allocated_after_zero_grad_bytes"
    ALLOCATED_BYTES = "allocated_bytes"
    BACKWARD_FLOPS = "backward_flops"
    CARRIED_ALLOCATED_BYTES = "carried_allocated_bytes"
    CARRIED_BYTES = "carried_bytes"
    DEVICE_USED_BYTES = "device_used_bytes"
    DROPOUT_NOT_BITWISE_VALUES = "dropout_not_bitwise_values"
    INFLIGHT_BYTES = "inflight_bytes"
    ITERATION_ALLOCATED_BYTES = "iteration_allocated_bytes"
    ITERATION_RESERVED_BYTES = "iteration_reserved_bytes"
    LOSS = "loss"
    NAN_ITERATIONS = "nan_iterations"
    NOT_BITWISE_VALUES = "not_bitwise_values"
    PEAK_AFTER_ITERATION = "peak_after_iteration"
    PEAK_ALLOCATED_BYTES = "peak_allocated_bytes"
    PEAK_ALLOCATED_SPREAD_BYTES = "peak_allocated_spread_bytes"
    PEAK_BACKWARD_BYTES = "peak_backward_bytes"
    PEAK_FORWARD_BYTES = "peak_forward_bytes"
    PEAK_OPTIMIZER_BYTES = "peak_optimizer_bytes"
    PEAK_RESERVED_BYTES = "peak_reserved_bytes"
    REPLAY_BYTES = "replay_bytes"
    REPLAY_OPS = "replay_ops"
    RESERVED_BYTES = "reserved_bytes"
    RESERVED_CHANGE_PCT = "reserved_change_pct"
    RETAINED_BYTES = "retained_bytes"
    RUN_PEAK_ALLOCATED_BYTES = "run_peak_allocated_bytes"
    RUN_PEAK_RESERVED_BYTES = "run_peak_reserved_bytes"
    SAVING_ALLOCATED_BYTES = "saving_allocated_bytes"
    SAVING_ALLOCATED_PCT = "saving_allocated_pct"
    SKIPPED_ITERATIONS = "skipped_iterations"
    STEP_TIME_COST_PCT = "step_time_cost_pct"
    STEP_TIME_MS = "step_time_ms"
    TFLOPS_CHANGE_PCT = "tflops_change_pct"
    TFLOPS_PER_GPU = "tflops_per_gpu"


@dataclass(frozen=True)
class Tolerance:
    """How far an actual value may be from the golden's, two-sided (a large improvement fails too).

    ``relative``: |actual - golden| <= max(rel * |golden|, floor) (``floor`` in the metric's unit, 0
    when absent); ``absolute``: |actual - golden| <= abs (e.g. percentage points); ``exact``: equal.
    """

    mode: Literal["relative", "absolute", "exact"]
    rel: float | None = None
    floor: float | None = None
    abs: float | None = None

    def as_dict(self) -> dict[str, Any]:
        if self.mode == "exact":
            return {"mode": "exact"}
        if self.mode == "absolute":
            return {"mode": "absolute", "abs": self.abs}
        return {"mode": "relative", "rel": self.rel} | (
            {} if self.floor is None else {"floor": self.floor}
        )


EXACT = Tolerance("exact")


def relative(rel: float, floor: float | None = None) -> Tolerance:
    return Tolerance("relative", rel, floor)


def absolute(allowed: float) -> Tolerance:
    return Tolerance("absolute", abs=allowed)


# Tolerance modes and the numeric keys each needs (a golden's rules are checked against this).
TOLERANCE_KEYS: dict[str, tuple[str, ...]] = {
    "exact": (),
    "relative": ("rel",),
    "absolute": ("abs",),
}
OPTIONAL_TOLERANCE_KEYS: dict[str, tuple[str, ...]] = {"relative": ("floor",)}

# An allocated-peak change smaller than this (percent of the control) is not a saving: it is within
# what allocator rounding and run-to-run noise move (the Moonlight core_attn row moved 0.01%).
MATERIAL_SAVING_PCT = 0.5
# A step-time change smaller than this (percent of the control) is no cost (paired steady windows).
MATERIAL_COST_PCT = 0.5


# Per rank: {iteration: (allocated_bytes, reserved_bytes | None, allocated_after_step_bytes | None,
# allocated_after_zero_grad_bytes | None)}: the peaks read after that iteration's optimizer step, then
# memory_allocated() right after the step and after zero_grad (absent from older records: None).
RankReadings = Sequence[Mapping[int, tuple[int, int | None, int | None, int | None]]]
# (readings of every rank, the headline iteration, the last iteration every rank reported) -> value
FromRanks = Callable[[RankReadings, int | None, int | None], int | None]


@dataclass(frozen=True)
class Metric:
    name: MetricName
    unit: str  # "bytes", "ms", "TFLOP/s", "iterations", "FLOPs", "ops", "values", "count"
    better: Better
    scope: Scope
    description: str
    nullable: bool = True
    required: bool = (
        True  # the schema demands the key (optional ones are newer than schema v1's first files)
    )
    golden: bool = True  # a golden row holds it
    tolerance: Tolerance = EXACT  # default for new run/reference goldens
    # Default for the [] control's absolute value in a golden that judges effects, where looser than
    # ``tolerance``: times drift with the machine (allocated bytes do not); a shift there is reported as
    # a shift of the control, not blamed on a label.
    control_tolerance: Tolerance | None = None
    from_ranks: FromRanks | None = field(default=None, compare=False)


def _hottest_allocated(readings: RankReadings, at: int | None) -> int | None:
    return None if at is None or not readings else max(rank[at][0] for rank in readings)


def _max_reserved(readings: RankReadings, at: int | None) -> int | None:
    if at is None or not readings:
        return None
    reserved = [rank[at][1] for rank in readings]
    known = [value for value in reserved if value is not None]
    return max(known) if len(known) == len(reserved) else None


def _hottest_carried(readings: RankReadings, at: int | None) -> int | None:
    """The most any rank still holds after zero_grad (else after the step) at the end of iteration ``at``."""
    if at is None or not readings:
        return None
    carried = [rank[at][3] if rank[at][3] is not None else rank[at][2] for rank in readings]
    known = [value for value in carried if value is not None]
    return max(known) if len(known) == len(carried) else None


def _allocated_spread(readings: RankReadings, at: int | None) -> int | None:
    if at is None or not readings:
        return None
    allocated = [rank[at][0] for rank in readings]
    return max(allocated) - min(allocated)


METRICS: tuple[Metric, ...] = (
    # --- headline: what a run's verdict is made on (docs/run-record.md) -----------------------------
    Metric(
        MetricName.PEAK_ALLOCATED_BYTES,
        "bytes",
        "lower",
        "headline",
        "hottest rank's max_memory_allocated() after the headline iteration",
        tolerance=relative(0.02),
        from_ranks=lambda readings, at, last: _hottest_allocated(readings, at),
    ),
    Metric(
        MetricName.PEAK_RESERVED_BYTES,
        "bytes",
        "lower",
        "headline",
        "max over ranks of max_memory_reserved() after the headline iteration",
        tolerance=relative(0.05),
        from_ranks=lambda readings, at, last: _max_reserved(readings, at),
    ),
    Metric(
        MetricName.PEAK_AFTER_ITERATION,
        "iterations",
        "exact",
        "headline",
        "the iteration the headline peaks were read after (2, or the last every rank reported)",
    ),
    Metric(
        MetricName.RUN_PEAK_ALLOCATED_BYTES,
        "bytes",
        "lower",
        "headline",
        "hottest rank's allocated peak after the last iteration every rank reported (the run's peak)",
        required=False,
        tolerance=relative(0.02),
        from_ranks=lambda readings, at, last: _hottest_allocated(readings, last),
    ),
    Metric(
        MetricName.RUN_PEAK_RESERVED_BYTES,
        "bytes",
        "lower",
        "headline",
        "max over ranks of the reserved peak after the last iteration every rank reported",
        required=False,
        tolerance=relative(0.05),
        from_ranks=lambda readings, at, last: _max_reserved(readings, last),
    ),
    Metric(
        MetricName.PEAK_ALLOCATED_SPREAD_BYTES,
        "bytes",
        "lower",
        "headline",
        "hottest minus coolest rank's allocated peak after the headline iteration (routing imbalance)",
        required=False,
        golden=False,
        from_ranks=lambda readings, at, last: _allocated_spread(readings, at),
    ),
    Metric(
        MetricName.CARRIED_ALLOCATED_BYTES,
        "bytes",
        "lower",
        "headline",
        "hottest rank's memory_allocated() after zero_grad (Bridge: after the optimizer step) at the end "
        "of the headline iteration: what the next iteration starts from (docs/carried-memory.md)",
        required=False,
        golden=False,  # judged against `[]` by the comparison, not pinned per golden
        from_ranks=lambda readings, at, last: _hottest_carried(readings, at),
    ),
    Metric(
        MetricName.STEP_TIME_MS,
        "ms",
        "lower",
        "headline",
        "mean step time over the steady window",
        tolerance=relative(0.05),
        control_tolerance=relative(0.10),
    ),
    Metric(
        MetricName.TFLOPS_PER_GPU,
        "TFLOP/s",
        "higher",
        "headline",
        "mean TFLOP/s per GPU over the steady window",
        tolerance=relative(0.05),
        control_tolerance=relative(0.10),
    ),
    # --- counts over the whole run ---------------------------------------------------------------------
    Metric(
        MetricName.SKIPPED_ITERATIONS,
        "iterations",
        "exact",
        "count",
        "iterations the optimizer skipped",
    ),
    Metric(
        MetricName.NAN_ITERATIONS, "iterations", "exact", "count", "iterations with a NaN/inf loss"
    ),
    # --- per iteration (metrics.iterations[]) ----------------------------------------------------------
    Metric(
        MetricName.STEP_TIME_MS,
        "ms",
        "lower",
        "per-iteration",
        "slowest rank's step time",
        golden=False,
    ),
    Metric(
        MetricName.LOSS,
        "loss",
        "exact",
        "per-iteration",
        "rank 0's world-reduced loss (null when NaN)",
        golden=False,
    ),
    Metric(
        MetricName.TFLOPS_PER_GPU,
        "TFLOP/s",
        "higher",
        "per-iteration",
        "the iteration's model FLOPs / the same slowest-rank step time / world size",
        golden=False,
    ),
    # --- per rank (metrics.ranks[].peaks[]) -------------------------------------------------------------
    Metric(
        MetricName.ALLOCATED_BYTES,
        "bytes",
        "lower",
        "per-rank",
        "the run's high-water mark of max_memory_allocated() through the iteration (process start, "
        "model build and earlier iterations included)",
        nullable=False,
        golden=False,
    ),
    Metric(
        MetricName.RESERVED_BYTES,
        "bytes",
        "lower",
        "per-rank",
        "the run's high-water mark of max_memory_reserved() through the iteration",
        golden=False,
    ),
    Metric(
        MetricName.ITERATION_ALLOCATED_BYTES,
        "bytes",
        "lower",
        "per-rank",
        "max_memory_allocated() within the iteration alone (peak statistics reset at its start): "
        "where growth happens",
        nullable=False,
        required=False,
        golden=False,
    ),
    Metric(
        MetricName.ITERATION_RESERVED_BYTES,
        "bytes",
        "lower",
        "per-rank",
        "max_memory_reserved() within the iteration alone",
        nullable=False,
        required=False,
        golden=False,
    ),
    Metric(
        MetricName.DEVICE_USED_BYTES,
        "bytes",
        "lower",
        "per-rank",
        "torch.cuda.mem_get_info() total - free at the same point: also what the caching allocator never "
        "sees (CUDA context, NCCL and DeepEP/HybridEP buffers)",
        nullable=False,
        required=False,
        golden=False,
    ),
    Metric(
        MetricName.ALLOCATED_AFTER_STEP_BYTES,
        "bytes",
        "lower",
        "per-rank",
        "memory_allocated() right after the optimizer step",
        required=False,
        golden=False,
    ),
    Metric(
        MetricName.ALLOCATED_AFTER_ZERO_GRAD_BYTES,
        "bytes",
        "lower",
        "per-rank",
        "memory_allocated() after zero_grad, at the end of the iteration (null: the back end zeroes "
        "gradients at the next step's start)",
        required=False,
        golden=False,
    ),
    # --- effects: a row against the matched [] control of the same set (record/effects.py) ------------
    # Judged first: paired within one sweep, they cancel most machine drift, and they are what a
    # recompute regression is (a label that saves less or costs more).
    Metric(
        MetricName.SAVING_ALLOCATED_BYTES,
        "bytes",
        "higher",
        "effect",
        "control's allocated peak minus the row's, at the same checkpoint and scope",
        tolerance=relative(0.20, floor=50_000_000),
    ),
    Metric(
        MetricName.SAVING_ALLOCATED_PCT,
        "%",
        "higher",
        "effect",
        "the saving, percent of the control's peak",
        tolerance=absolute(0.5),
    ),
    Metric(
        MetricName.RESERVED_CHANGE_PCT,
        "%",
        "lower",
        "effect",
        "reserved peak vs the control's, percent",
        tolerance=absolute(2.0),
    ),
    Metric(
        MetricName.STEP_TIME_COST_PCT,
        "%",
        "lower",
        "effect",
        "steady step time vs the control's, percent",
        tolerance=absolute(1.0),
    ),
    Metric(
        MetricName.TFLOPS_CHANGE_PCT,
        "%",
        "higher",
        "effect",
        "TFLOP/s per GPU vs the control's, percent",
        tolerance=absolute(1.0),
    ),
    # --- CPU probe rows: deterministic counts, compared exactly ------------------------------------------
    Metric(
        MetricName.RETAINED_BYTES,
        "bytes",
        "lower",
        "probe",
        "bytes autograd saved for backward",
        nullable=False,
    ),
    Metric(
        MetricName.BACKWARD_FLOPS,
        "FLOPs",
        "lower",
        "probe",
        "FLOPs of backward, replays included",
        nullable=False,
    ),
    Metric(
        MetricName.REPLAY_BYTES,
        "bytes",
        "lower",
        "probe",
        "bytes recomputed during backward",
        nullable=False,
    ),
    Metric(
        MetricName.REPLAY_OPS,
        "ops",
        "lower",
        "probe",
        "operators replayed during backward",
        nullable=False,
        required=False,
    ),
    Metric(
        MetricName.NOT_BITWISE_VALUES,
        "values",
        "exact",
        "probe",
        "loss and gradients not bit-identical to the control's",
        nullable=False,
        required=False,
    ),
    Metric(
        MetricName.DROPOUT_NOT_BITWISE_VALUES,
        "values",
        "exact",
        "probe",
        "the same with dropout on (RNG replay)",
        nullable=False,
        required=False,
    ),
    Metric(
        MetricName.CARRIED_BYTES,
        "bytes",
        "lower",
        "probe",
        "bytes a second step leaves alive after backward: not parameters, gradients or the batch "
        "(docs/carried-memory.md)",
        nullable=False,
        required=False,
    ),
    Metric(
        MetricName.PEAK_FORWARD_BYTES,
        "bytes",
        "lower",
        "probe",
        "at the forward's peak, the bytes that are not parameters, buffers or the batch: activations + temporaries (MemTracker; harness.probe.measurement.peaks)",
        nullable=False,
        required=False,
    ),
    Metric(
        MetricName.PEAK_BACKWARD_BYTES,
        "bytes",
        "lower",
        "probe",
        "the same at the backward's peak: activations, temporaries (activation gradients) and parameter gradients alive together",
        nullable=False,
        required=False,
    ),
    Metric(
        MetricName.PEAK_OPTIMIZER_BYTES,
        "bytes",
        "lower",
        "probe",
        "the same at the Adam step's peak: gradients, optimizer state and its temporaries, plus what backward left alive",
        nullable=False,
        required=False,
    ),
    Metric(
        MetricName.INFLIGHT_BYTES,
        "bytes",
        "lower",
        "probe",
        "on a pipeline stage under 1F1B: the most bytes autograd holds at once for the micro-batches in flight (forwarded, not yet reached by backward), sampled as each forward returns (harness.probe.layouts.pipeline)",
        nullable=False,
        required=False,
    ),
)


def metrics_in(scope: Scope) -> tuple[Metric, ...]:
    return tuple(metric for metric in METRICS if metric.scope == scope)


def metric(name: str, scope: Scope | None = None) -> Metric | None:
    """The metric called ``name`` (in ``scope`` when given; else the first declared)."""
    return next(
        (m for m in METRICS if m.name == name and (scope is None or m.scope == scope)), None
    )


def declared_metric(name: str) -> Metric:
    """The metric called ``name``, which the registry declares: a name the harness itself spells (an
    entry of ``RUN_GOLDEN_METRICS``, a golden's checked metric), so a miss is a bug, not bad input."""
    found = metric(name)
    if found is None:
        raise KeyError(f"no metric {name!r} in the registry")
    return found


# A golden row of a run or reference record holds these, in this order (effects: rows with a control).
RUN_GOLDEN_METRICS: tuple[str, ...] = tuple(
    m.name for m in METRICS if m.golden and m.scope in ("headline", "count")
)
EFFECT_METRICS: tuple[str, ...] = tuple(m.name for m in METRICS if m.scope == "effect")


def higher_is_better(name: str) -> bool:
    found = metric(name)
    return found is not None and found.better == "higher"


def unit_of(name: str) -> str | None:
    found = metric(name)
    return None if found is None else found.unit


def default_tolerance_policy(kind: str, effects: bool = False) -> dict[str, dict[str, Any]]:
    """The per-metric rules a new golden of ``kind`` starts from (CPU probes: ``*`` = exact).

    With ``effects`` (the set has a matched control) the effect rules come first, and the absolute
    rules, which then judge the control row only, are the looser control tolerances."""
    if kind not in RUN_KINDS:
        return {"*": EXACT.as_dict()}
    policy = (
        {name: declared_metric(name).tolerance.as_dict() for name in EFFECT_METRICS}
        if effects
        else {}
    )
    for name in RUN_GOLDEN_METRICS:
        found = declared_metric(name)
        rule = (
            found.control_tolerance
            if effects and found.control_tolerance is not None
            else found.tolerance
        )
        policy[name] = rule.as_dict()
    return policy
