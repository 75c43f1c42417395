"""A row's run record, assembled by the runner from the ranks' evidence (never by a rank itself).

A rank that dies cannot write its record, so the runner writes every record — completed or not —
through ``harness.record``'s constructors. Per iteration: the slowest rank's step time, rank 0's
loss (already the world mean), NaN/skipped if any rank says so (a rank that stopped on a NaN loss says so in its error line), and TFLOP/s per GPU from that same
step time: the iteration's model FLOPs / step time / world size — Bridge's own definition
(``training_log``: the interval's FLOPs over the barrier-synchronised interval time), so step time
and throughput can never disagree. Per rank, every rank (the comparison chooses the golden's scope):
the allocator peaks read after each iteration's optimizer step and the device memory in use then.
On CPU there is no caching allocator, so no rank reports a peak; the record then carries no per-rank
peaks (``peak_scope: unreported``) and says why in ``workload.extra.device_memory``.

How the workload actually ran is part of its identity: the attention back end and the MoE token
dispatcher the ranks report (``note`` events) replace the recipe's request in the record
(``workload.attention_backend``, ``workload.extra.moe_dispatcher``), with the request kept beside
them when they differ.

The revision pins are the ranks' own (each rank reports ``collect_revisions()`` from its interpreter,
inside its container when there is one), never the runner's: the runner may live outside the image.
Ranks that disagree on a pin, or ranks whose stack is not the one the launch was checked against
(the runner's own, or the in-container preflight's), are refused by name (``StackDisagreement``):
such a record would carry pins no golden of either stack may judge.
"""

from __future__ import annotations

import re
from typing import Any

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.record.build import (
    hardware,
    iteration_row,
    new_record,
    rank_peaks,
    run_metrics,
    workload,
)
from harness.record.metrics import MetricName
from harness.record.model import PIN_KEYS, IterationRow, RankPeaks, Record
from harness.run.classify import Classification, error_kind
from harness.run.environment import environment_differences
from harness.run.events import RankEvidence
from harness.run.recipes import Recipe

CPU_MEMORY_NOTE = "not measured: CPU tensors have no caching-allocator peak (torch.cuda.max_memory_* is CUDA-only)"


class StackDisagreement(UsageError):
    """The ranks of one row ran different stacks, or not the stack the launch was checked against."""


def _pins(revisions: dict[str, Any]) -> dict[str, Any]:
    return {key: revisions.get(key) for key in PIN_KEYS}


def _differences(found: dict[str, Any], expected: dict[str, Any]) -> str:
    return "; ".join(
        f"{key} {found.get(key)} vs {expected.get(key)}"
        for key in PIN_KEYS
        if found.get(key) != expected.get(key)
    )


def ranks_revisions(
    row: str, ranks: list[RankEvidence], expected: dict[str, Any], checked_by: str
) -> dict[str, Any]:
    """The revisions the row's record carries: the lowest reporting rank's, which every other rank and
    ``expected`` (the stack ``checked_by`` saw before launch) must match on every pin. No rank reported
    (all died before their first line): ``expected``, the stack they were launched into."""
    reporting = [rank for rank in ranks if rank.revisions is not None]
    if not reporting:
        return expected
    lead = reporting[0]
    assert lead.revisions is not None  # chosen above for reporting them
    for other in reporting[1:]:
        assert other.revisions is not None
        if _pins(other.revisions) != _pins(lead.revisions):
            raise StackDisagreement(
                f"row {row!r}: rank {other.rank} and rank {lead.rank} ran different stacks "
                f"({_differences(other.revisions, lead.revisions)}): no record is written for a mixed stack"
            )
    if _pins(lead.revisions) != _pins(expected):
        raise StackDisagreement(
            f"row {row!r}: the ranks ran another stack than {checked_by} checked "
            f"({_differences(lead.revisions, expected)}): no record is written for it"
        )
    return lead.revisions


def device_profile(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100_80GB``; ``NVIDIA H200`` -> ``H200``."""
    model = re.search(r"\b([A-Z]+\d+[A-Z]*)\b", name)
    memory = re.search(r"\b(\d+)\s*GB\b", name)
    if model is None:
        return re.sub(r"\W+", "_", name).strip("_")
    return f"{model.group(1)}_{memory.group(1)}GB" if memory else model.group(1)


def tflops_per_gpu(
    flops: float | None, step_time_ms: float | None, world_size: int
) -> float | None:
    """One iteration's TFLOP/s per GPU from the same step time the record reports for it."""
    if flops is None or not step_time_ms:
        return None
    return flops / (step_time_ms / 1000.0) / world_size / 1e12


def _iterations(ranks: list[RankEvidence], world_size: int) -> list[IterationRow]:
    by_iteration: dict[int, list[dict[str, Any]]] = {}
    for rank in ranks:
        for event in rank.iterations:
            by_iteration.setdefault(event["iteration"], []).append({**event, "rank": rank.rank})
    # A rank stops on a non-finite loss before it reports that iteration: the iteration still happened,
    # with a NaN loss, so the record's NaN count matches its ``nan`` outcome.
    for rank in ranks:
        for error in rank.errors:
            iteration = error.get("iteration")
            if (
                isinstance(iteration, int)
                and iteration >= 1
                and iteration not in by_iteration
                and error_kind(error.get("type"), error.get("message", "")) == "nan"
            ):
                by_iteration[iteration] = [{"iteration": iteration, "nan": True, "rank": rank.rank}]
    rows = []
    for iteration, events in sorted(by_iteration.items()):
        times = [
            e[MetricName.STEP_TIME_MS] for e in events if e.get(MetricName.STEP_TIME_MS) is not None
        ]
        step_time = max(times) if times else None
        flops = next((rank.flops[iteration] for rank in ranks if iteration in rank.flops), None)
        lead = min(events, key=lambda e: e["rank"])
        loss = float("nan") if any(e.get("nan") for e in events) else lead.get(MetricName.LOSS)
        rows.append(
            iteration_row(
                iteration,
                step_time_ms=step_time,
                loss=loss,
                tflops_per_gpu=tflops_per_gpu(flops, step_time, world_size),
                skipped=any(e.get("skipped") for e in events),
            )
        )
    return rows


def _rank_peaks(ranks: list[RankEvidence]) -> list[RankPeaks]:
    """Every rank that reported a peak, every iteration it reported (none is dropped or merged)."""
    result = []
    for rank in ranks:
        peaks = {
            e["iteration"]: (
                e[MetricName.ALLOCATED_BYTES],
                e.get(MetricName.RESERVED_BYTES),
                e.get(MetricName.ALLOCATED_AFTER_STEP_BYTES),
                e.get(MetricName.ALLOCATED_AFTER_ZERO_GRAD_BYTES),
                e.get(MetricName.DEVICE_USED_BYTES),
                e.get(MetricName.ITERATION_ALLOCATED_BYTES),
                e.get(MetricName.ITERATION_RESERVED_BYTES),
            )
            for e in rank.iterations
            if e.get(MetricName.ALLOCATED_BYTES) is not None
        }
        if peaks:
            result.append(rank_peaks(rank.rank, peaks))
    return result


def _as_run(recipe: Recipe, ranks: list[RankEvidence]) -> tuple[str, dict[str, str]]:
    """(attention back end, extra facts) as the ranks report they ran, the recipe's request beside them."""
    notes: dict[str, str] = {}
    for rank in ranks:  # rank 0's wins: every rank runs the same config
        notes = {**rank.notes, **notes}
    attention = notes.pop("attention_backend", recipe.attention_backend)
    if attention != recipe.attention_backend:
        notes["attention_backend_requested"] = recipe.attention_backend
    return attention, notes


def _environment(ranks: list[RankEvidence]) -> tuple[dict[str, str] | None, list[str]]:
    """(the lowest reporting rank's environment, ``rank N: NAME a -> b`` wherever another rank's differs)."""
    reported = [rank for rank in ranks if rank.environment is not None]
    if not reported:
        return None, []
    first = reported[0].environment or {}
    spread = [
        f"rank {rank.rank}: {difference}"
        for rank in reported[1:]
        for difference in environment_differences(first, rank.environment or {})
    ]
    return first, spread


def build_record(
    recipe: Recipe,
    row: str,
    ranks: list[RankEvidence],
    outcome: Classification,
    *,
    revisions: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
) -> Record:
    named = next((rank for rank in ranks if rank.device_name is not None), None)
    on_gpu = recipe.device == "cuda"
    if not on_gpu:
        profile, sm = "cpu", None
    elif named is None:  # no rank got as far as naming its GPU (e.g. killed while importing)
        profile, sm = "unidentified", None
    else:
        assert named.device_name is not None  # chosen above for naming it
        profile, sm = device_profile(named.device_name), named.sm
    extra = {
        "nnodes": str(recipe.nnodes),
        "nproc_per_node": str(recipe.nproc_per_node),
        "expert_tp": str(recipe.parallelism.expert_tp),
        "launcher": "torchrun",
    }
    if not on_gpu:
        extra["device_memory"] = CPU_MEMORY_NOTE
    attention, facts = _as_run(recipe, ranks)
    extra.update(facts)
    environment, spread = _environment(ranks)
    if spread:
        extra["environment_differs_across_ranks"] = "; ".join(spread)
    return new_record(
        "run",
        workload=workload(
            recipe=recipe.name,
            model=recipe.model,
            backend=recipe.backend,
            seq_length=recipe.seq_length,
            micro_batch_size=recipe.micro_batch_size,
            global_batch_size=recipe.global_batch_size,
            precision=recipe.precision,
            attention_backend=attention,
            train_iters=recipe.train_iters,
            parallelism=recipe.parallelism.record_layout(recipe.world_size),
            extra=extra,
            environment=environment,
        ),
        hardware=hardware(profile, recipe.world_size if on_gpu else 0, sm=sm),
        recompute=RecomputeFields.parse(row),
        metrics=run_metrics(
            _iterations(ranks, recipe.world_size), _rank_peaks(ranks), recipe.steady_window
        ),
        outcome=outcome.as_record(),
        revisions=revisions,
        provenance=provenance,
    )
