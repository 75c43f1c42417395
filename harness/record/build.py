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
Every constructor returns plain dicts; ``new_record`` validates the result.
"""

from __future__ import annotations

import copy
import math
import socket
import uuid
from datetime import datetime, timezone
from statistics import fmean
from typing import Any, Mapping, Sequence

from harness.config.fields import RecomputeFields
from harness.record.schema import HEADLINE_ITERATION, SCHEMA, SCHEMA_VERSION, validate_record


def iteration_row(
    iteration: int,
    *,
    step_time_ms: float | None = None,
    loss: float | None = None,
    tflops_per_gpu: float | None = None,
    skipped: bool = False,
) -> dict[str, Any]:
    """One training iteration. A NaN/inf loss becomes ``loss=None, nan=True`` (files never hold NaN)."""
    nan = loss is not None and not math.isfinite(loss)
    return {
        "iteration": iteration,
        "step_time_ms": step_time_ms,
        "loss": None if nan else loss,
        "tflops_per_gpu": tflops_per_gpu,
        "skipped": skipped,
        "nan": nan,
    }


def rank_peaks(rank: int, peaks: Mapping[int, tuple[int, int | None]]) -> dict[str, Any]:
    """A rank's ``(max_memory_allocated, max_memory_reserved)`` read after each iteration's optimizer step."""
    return {
        "rank": rank,
        "peaks": [
            {"iteration": it, "allocated_bytes": alloc, "reserved_bytes": reserved}
            for it, (alloc, reserved) in sorted(peaks.items())
        ],
    }


def _hottest(ranks: Sequence[dict[str, Any]], reported: list[dict[int, dict[str, Any]]],
             at: int | None) -> tuple[int | None, tuple[int | None, int | None]]:
    """(rank, (allocated, reserved)) of the hottest rank after iteration ``at``; reserved is the max over ranks."""
    if at is None:
        return None, (None, None)
    hottest = max(range(len(ranks)), key=lambda i: reported[i][at]["allocated_bytes"])
    reserved = [r[at]["reserved_bytes"] for r in reported]
    return ranks[hottest]["rank"], (reported[hottest][at]["allocated_bytes"], None if None in reserved else max(reserved))


def headline(
    iterations: Sequence[dict[str, Any]],
    ranks: Sequence[dict[str, Any]],
    steady_window: tuple[int, int] | None,
    peak_scope: str,
) -> dict[str, Any]:
    """The numbers a verdict is made on.

    Peak: the hottest rank's post-optimizer allocated peak after iteration 2 (the skill's contract), or
    after the last iteration every rank reported when the run stopped earlier. Run peak: the same after
    the last iteration every rank reported. Step time and TFLOP/s:
    means over the steady window, skipping skipped and NaN iterations.
    """
    reported = [{p["iteration"]: p for p in r["peaks"]} for r in ranks]
    common = set.intersection(*(set(r) for r in reported)) if reported else set()
    at = HEADLINE_ITERATION if HEADLINE_ITERATION in common else max(common, default=None)
    peak_rank, (peak_allocated, peak_reserved) = _hottest(ranks, reported, at)
    # The allocator's peaks are never reset, so the last iteration every rank reported holds the run's
    # peak: what grew after iteration 2 (CUDA-graph pools captured later, a leak) shows there.
    _, (run_peak_allocated, run_peak_reserved) = _hottest(ranks, reported, max(common, default=None))
    step_time = tflops = None
    if steady_window is not None:
        first, last = steady_window
        steady = [row for row in iterations if first <= row["iteration"] <= last and not row["skipped"] and not row["nan"]]
        times = [row["step_time_ms"] for row in steady if row["step_time_ms"] is not None]
        flops = [row["tflops_per_gpu"] for row in steady if row["tflops_per_gpu"] is not None]
        step_time = fmean(times) if times else None
        tflops = fmean(flops) if flops else None
    return {
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "peak_rank": peak_rank,
        "peak_after_iteration": at,
        "peak_scope": peak_scope if ranks else "unreported",
        "run_peak_allocated_bytes": run_peak_allocated,
        "run_peak_reserved_bytes": run_peak_reserved,
        "step_time_ms": step_time,
        "tflops_per_gpu": tflops,
    }


def run_metrics(
    iterations: Sequence[dict[str, Any]],
    ranks: Sequence[dict[str, Any]],
    steady_window: tuple[int, int] | None,
    peak_scope: str = "all-ranks",
) -> dict[str, Any]:
    """Metrics of a GPU run: per-iteration rows, per-rank peaks, the steady window and the headline."""
    return {
        "iterations": list(iterations),
        "ranks": list(ranks),
        "steady_window": None if steady_window is None else {"first": steady_window[0], "last": steady_window[1]},
        "headline": headline(iterations, ranks, steady_window, peak_scope),
        "skipped_iterations": sum(row["skipped"] for row in iterations),
        "nan_iterations": sum(row["nan"] for row in iterations),
    }


def cpu_probe_metrics(*, retained_bytes: int, backward_flops: int, replay_bytes: int, **more: int | float) -> dict[str, Any]:
    """Metrics of one CPU-probe row: deterministic counts, compared exactly against CPU goldens."""
    return {"retained_bytes": retained_bytes, "backward_flops": backward_flops, "replay_bytes": replay_bytes, **more}


def outcome(
    status: str,
    *,
    iteration: int | None = None,
    phase: str | None = None,
    ranks: Sequence[int] = (),
    message: str = "",
    site: str | None = None,
) -> dict[str, Any]:
    """How the run ended: status, the iteration and phase it stopped in, the failing rank(s)."""
    result: dict[str, Any] = {"status": status, "iteration": iteration, "phase": phase, "ranks": list(ranks), "message": message}
    if site is not None:
        result["site"] = site
    return result


def parallelism(
    tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, dp: int = 1, expert_dp: int | None = None, vpp: int | None = None
) -> dict[str, int | None]:
    return {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": dp, "expert_dp": expert_dp, "vpp": vpp}


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
    parallelism: dict[str, int | None],
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "recipe": recipe, "model": model, "backend": backend, "seq_length": seq_length,
        "micro_batch_size": micro_batch_size, "global_batch_size": global_batch_size, "precision": precision,
        "attention_backend": attention_backend, "train_iters": train_iters, "parallelism": parallelism,
    }
    if extra:
        result["extra"] = extra
    return result


def hardware(device: str, gpu_count: int, sm: str | None = None, host: str | None = None) -> dict[str, Any]:
    """``device`` names the GPU model (``H100_80GB``) or ``cpu``; ``host`` defaults to this machine."""
    return {"device": device, "gpu_count": gpu_count, "sm": sm, "host": socket.gethostname() if host is None else host}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_record(
    kind: str,
    *,
    workload: dict[str, Any],
    hardware: dict[str, Any],
    recompute: RecomputeFields,
    metrics: dict[str, Any],
    outcome: dict[str, Any],
    revisions: dict[str, Any] | None = None,
    record_id: str | None = None,
    created: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A validated record. ``revisions`` defaults to this process's ``collect_revisions()``."""
    if revisions is None:
        from harness.config.revisions import collect_revisions

        revisions = collect_revisions()
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "id": record_id or f"{workload['recipe']}/{recompute.name}/{uuid.uuid4().hex[:12]}",
        "created": created or now_iso(),
        "revisions": copy.deepcopy(revisions),
        "hardware": hardware,
        "workload": workload,
        "recompute": recompute.as_dict(),
        "metrics": metrics,
        "outcome": outcome,
    }
    if provenance is not None:
        record["provenance"] = provenance
    return validate_record(record, f"record {record['id']}")
