"""Small constructors for run records, so the CPU probe and the torchrun runner never hand-assemble one.

Typical use (runner)::

    metrics = run_metrics(
        iterations=[iteration_row(i, step_time_ms=t, loss=l, tflops_per_gpu=f) for ...],
        ranks=[rank_peaks(r, {1: (alloc1, reserved1), 2: (alloc2, reserved2), ...}) for r in ...],
        steady_window=(11, 20),
    )
    record = new_record("run", workload=workload(...), hardware=hardware("H100_80GB", 8),
                        recompute=RecomputeFields.selective("moe_act"), metrics=metrics,
                        outcome=outcome("completed", iteration=20))

and (CPU probe) ``new_record("cpu-probe", ..., metrics=cpu_probe_metrics(retained_bytes=..., ...))``.
Every constructor returns the typed model (``harness.record.model``); ``new_record`` validates the result.
"""

from __future__ import annotations

import math
import socket
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from statistics import fmean
from typing import Any

from harness.config.fields import RecomputeFields
from harness.record.metrics import MetricName, metrics_in
from harness.record.model import (
    Hardware,
    Headline,
    IterationRow,
    Outcome,
    ParallelLayout,
    PeakReading,
    ProbeMetrics,
    RankPeaks,
    Record,
    Revisions,
    RunMetrics,
    SteadyWindow,
    Workload,
)
from harness.record.schema import HEADLINE_ITERATION


def iteration_row(
    iteration: int,
    *,
    step_time_ms: float | None = None,
    loss: float | None = None,
    tflops_per_gpu: float | None = None,
    skipped: bool = False,
) -> IterationRow:
    """One training iteration. A NaN/inf loss becomes ``loss=None, nan=True`` (files never hold NaN)."""
    nan = loss is not None and not math.isfinite(loss)
    return IterationRow(
        iteration, step_time_ms, None if nan else loss, tflops_per_gpu, skipped, nan
    )


def rank_peaks(rank: int, peaks: Mapping[int, tuple[int, *tuple[int | None, ...]]]) -> RankPeaks:
    """A rank's ``(max_memory_allocated, max_memory_reserved[, allocated after the step, after zero_grad])``
    read after each iteration's optimizer step."""
    return RankPeaks(rank, [PeakReading(it, *values) for it, values in sorted(peaks.items())])


def headline(
    iterations: Sequence[IterationRow],
    ranks: Sequence[RankPeaks],
    steady_window: tuple[int, int] | None,
    peak_scope: str,
) -> Headline:
    """The numbers a verdict is made on.

    Peaks are read after iteration 2 (the skill's contract), or after the last iteration every rank
    reported when the run stopped earlier; the run peaks after that last iteration (the allocator's
    high-water marks are kept across the per-iteration resets, so what grew after iteration 2 — CUDA-graph pools captured later, a leak —
    shows there). Every peak metric is computed by its registry entry (``Metric.from_ranks``). Step
    time and TFLOP/s: means over the steady window, skipping skipped and NaN iterations.
    """
    readings = [{p.iteration: p.reading() for p in r.peaks} for r in ranks]
    common = set.intersection(*(set(r) for r in readings)) if readings else set()
    at = HEADLINE_ITERATION if HEADLINE_ITERATION in common else max(common, default=None)
    last = max(common, default=None)
    values: dict[str, int | float | None] = {}
    for metric in metrics_in("headline"):
        if metric.from_ranks is not None:
            values[metric.name] = metric.from_ranks(readings, at, last)
    values[MetricName.PEAK_AFTER_ITERATION] = at
    step_time = tflops = None
    if steady_window is not None:
        first, final = steady_window
        steady = [
            row
            for row in iterations
            if first <= row.iteration <= final and not row.skipped and not row.nan
        ]
        times = [row.step_time_ms for row in steady if row.step_time_ms is not None]
        flops = [row.tflops_per_gpu for row in steady if row.tflops_per_gpu is not None]
        step_time = fmean(times) if times else None
        tflops = fmean(flops) if flops else None
    values[MetricName.STEP_TIME_MS], values[MetricName.TFLOPS_PER_GPU] = step_time, tflops
    peak_rank = None
    if at is not None:
        peak_rank = ranks[max(range(len(ranks)), key=lambda i: readings[i][at][0])].rank
    return Headline(
        values=values, peak_rank=peak_rank, peak_scope=peak_scope if ranks else "unreported"
    )


def run_metrics(
    iterations: Sequence[IterationRow],
    ranks: Sequence[RankPeaks],
    steady_window: tuple[int, int] | None,
    peak_scope: str = "all-ranks",
) -> RunMetrics:
    """Metrics of a GPU run: per-iteration rows, per-rank peaks, the steady window and the headline."""
    return RunMetrics(
        iterations=list(iterations),
        ranks=list(ranks),
        steady_window=None if steady_window is None else SteadyWindow(*steady_window),
        headline=headline(iterations, ranks, steady_window, peak_scope),
        skipped_iterations=sum(row.skipped for row in iterations),
        nan_iterations=sum(row.nan for row in iterations),
    )


def cpu_probe_metrics(
    *, retained_bytes: int, backward_flops: int, replay_bytes: int, **more: float
) -> ProbeMetrics:
    """Metrics of one CPU-probe row: deterministic counts, compared exactly against CPU goldens."""
    return ProbeMetrics(
        {
            MetricName.RETAINED_BYTES: retained_bytes,
            MetricName.BACKWARD_FLOPS: backward_flops,
            MetricName.REPLAY_BYTES: replay_bytes,
            **more,
        }
    )


def outcome(
    status: str,
    *,
    iteration: int | None = None,
    phase: str | None = None,
    ranks: Sequence[int] = (),
    message: str = "",
    site: str | None = None,
) -> Outcome:
    """How the run ended: status, the iteration and phase it stopped in, the failing rank(s)."""
    return Outcome(status, iteration, phase, list(ranks), message, site)


def parallelism(
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp: int = 1,
    expert_dp: int | None = None,
    vpp: int | None = None,
) -> ParallelLayout:
    return ParallelLayout(tp, pp, cp, ep, dp, expert_dp, vpp)


def workload(
    *,
    recipe: str,
    model: str,
    backend: str,
    seq_length: int,
    micro_batch_size: int,
    global_batch_size: int,
    precision: str,
    attention_backend: str | None,
    train_iters: int | None,
    parallelism: ParallelLayout,
    extra: dict[str, str] | None = None,
    environment: dict[str, str] | None = None,
) -> Workload:
    return Workload(
        recipe,
        model,
        backend,
        seq_length,
        micro_batch_size,
        global_batch_size,
        precision,
        attention_backend,
        train_iters,
        parallelism,
        dict(extra or {}),
        None if environment is None else dict(environment),
    )


def hardware(
    device: str, gpu_count: int, sm: str | None = None, host: str | None = None
) -> Hardware:
    """``device`` names the GPU model (``H100_80GB``) or ``cpu``; ``host`` defaults to this machine."""
    return Hardware(device, gpu_count, sm, socket.gethostname() if host is None else host)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def new_record(
    kind: str,
    *,
    workload: Workload,
    hardware: Hardware,
    recompute: RecomputeFields,
    metrics: RunMetrics | ProbeMetrics,
    outcome: Outcome,
    revisions: Revisions | dict[str, Any] | None = None,
    record_id: str | None = None,
    created: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> Record:
    """A validated record. ``revisions`` defaults to this process's ``collect_revisions()``."""
    if revisions is None:
        from harness.config.revisions import collect_revisions

        revisions = collect_revisions()
    # A copy: records of one sweep never share mutable revision objects.
    revisions = Revisions.from_json(
        revisions.to_json() if isinstance(revisions, Revisions) else revisions
    )
    record = Record(
        kind=kind,
        id=record_id or f"{workload.recipe}/{recompute.name}/{uuid.uuid4().hex[:12]}",
        created=created or now_iso(),
        revisions=revisions,
        hardware=hardware,
        workload=workload,
        recompute=recompute,
        metrics=metrics,
        outcome=outcome,
        provenance=None if provenance is None else dict(provenance),
    )
    return record.validated()
