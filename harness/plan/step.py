"""A rank's memory over iteration 1 and a steady-state iteration, moment by moment, and its peak.

Persistent bytes (from the real model's shard, ``harness.plan.parameters``; Megatron Core's DDP and
optimizer code):

- parameters in their dtype; with the distributed optimizer MCore's DDP moves them into one
  contiguous buffer (the same bytes);
- the DDP gradient buffer, allocated before the first step: fp32 with ``grad_reduce_in_fp32`` /
  ``--accumulate-allreduce-grads-in-fp32`` (Bridge's ``main_grads_dtype``), else the parameter dtype;
- the optimizer: fp32 main parameters for 16-bit training, allocated when the optimizer is built, and
  Adam's ``exp_avg`` / ``exp_avg_sq`` (fp32), allocated lazily by the first ``step()``; the
  distributed optimizer shards all three over the data-parallel group (dense parameters) and the
  expert data-parallel group (expert parameters); with 16-bit gradients the step also makes an fp32
  copy of the (sharded) gradients.

Moments, per iteration (iteration 1 holds no Adam moments until its step; a steady-state iteration
holds them throughout):

- ``activations``: the stage's in-flight micro-batches' retained layers plus the row's transient (the
  layer's forward/backward peak, or a checkpoint's replay);
- ``logits and cross entropy`` (last stage): the retained stage plus the output layer's logits ``[s, b, V/tp]`` in the
  parameter dtype and the fp32 copy cross entropy works in (``vocab_parallel_cross_entropy``:
  ``.float()``, then exp in place: the copy is what backward keeps), and the output layer's input;
- ``optimizer step``: the persistent bytes after the step, plus the fp32 gradient copy.

Not seen, with the size assumed (``UNSEEN``): they are named in the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from harness.plan.activations import RowActivations
from harness.plan.parameters import ParameterCounts
from harness.plan.schedule import chunk_layers, in_flight_chunks
from harness.plan.workload import TrainingJob

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Transformer Engine's cuBLAS workspace on Hopper (transformer_engine/pytorch/module/base.py,
# get_cublas_workspace_size_bytes: 32 MiB), a torch allocation, so in max_memory_allocated.
CUBLAS_WORKSPACE_BYTES = 32 * 1024 * 1024
UNSEEN = {
    "allocator fragmentation": "0 (max_memory_allocated counts allocated blocks, not reserved ones)",
    "NCCL buffers": "0 (NCCL allocates outside PyTorch's caching allocator)",
    "CUDA-graph private pools": "0 (static inputs/outputs of captured layers; Nemotron's attention "
    "and Mamba graphs keep them, the card calls them material)",
    "dispatcher buffers of alltoall / HybridEP": "as the CPU allgather dispatcher's (measured)",
    "cuBLAS / TE workspace": f"{CUBLAS_WORKSPACE_BYTES} bytes (counted)",
    "TE fused kernels' own saved tensors": "as the CPU stand-ins' (docs/estimate.md lists them)",
}


@dataclass
class Moment:
    iteration: int
    phase: str
    module: str
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass
class RankPeak:
    """One distinct rank (a pipeline stage; TP, EP and DP ranks of a stage are alike)."""

    stage: int
    ranks: list[int]
    peak: Moment
    moments: list[Moment] = field(default_factory=list)

    def first_over(self, budget: int) -> Moment | None:
        return next((m for m in self.moments if m.total > budget), None)


def persistent_bytes(
    workload: TrainingJob, dense: int, expert: int, *, moments: bool
) -> dict[str, int]:
    """Parameters, gradients and optimizer state of a rank with ``dense`` + ``expert`` elements."""
    width = DTYPE_BYTES[workload.precision]
    grad = 4 if workload.grad_reduce_in_fp32 else width
    dp, edp = (
        (workload.data_parallel, workload.expert_data_parallel)
        if workload.distributed_optimizer
        else (1, 1)
    )
    per_param = (4 if width != 4 else 0) + (2 * workload.moment_bytes if moments else 0)
    optimizer = Fraction(dense * per_param, dp) + Fraction(expert * per_param, edp)
    return {
        "parameters": (dense + expert) * width,
        "gradients": (dense + expert) * grad,
        "optimizer_state": round(optimizer),
    }


def _stage_activations(
    workload: TrainingJob, row: RowActivations, kinds: list[str], stage: int
) -> tuple[Fraction, Fraction, str]:
    """(retained over the in-flight micro-batches, transient, where) on ``stage`` under ``row``."""
    layout = workload.parallelism
    chunks = chunk_layers(len(kinds), layout, stage)
    in_flight = in_flight_chunks(layout, stage, workload.micro_batches)
    input_bytes = Fraction(_hidden_bytes(workload))
    retained = Fraction(0)
    transient = row.transient
    for chunk in in_flight:
        chunk_kinds = [kinds[i] for i in chunks[chunk]]
        if row.full is None:
            retained += sum((row.per_layer[k] for k in chunk_kinds), Fraction(0))
            continue
        method, n = row.full
        groups = (
            [chunk_kinds[i : i + n] for i in range(0, len(chunk_kinds), n)]
            if method == "uniform"
            else [[k] for k in chunk_kinds[:n]]
        )
        kept = chunk_kinds[n:] if method == "block" else []
        retained += input_bytes * len(groups) + sum((row.per_layer[k] for k in kept), Fraction(0))
        replay = max(
            (sum((row.per_layer[k] for k in g), Fraction(0)) for g in groups), default=Fraction(0)
        )
        transient = max(transient, row.transient + replay)
    last = chunks[in_flight[-1]][-1]
    where = f"layer {last} ({kinds[last]})"
    return retained, transient, where


def _hidden_bytes(workload: TrainingJob) -> int:
    """One micro-batch's ``[s/tp, b, h]`` hidden state (sequence parallel), in the parameter dtype."""
    tp = workload.parallelism.tp if workload.sequence_parallel else 1
    return (
        workload.seq_length
        // tp
        * workload.micro_batch_size
        * workload.arch.config["hidden_size"]
        * DTYPE_BYTES[workload.precision]
    )


def logits_bytes(workload: TrainingJob) -> tuple[int, int]:
    """(logits in the parameter dtype, cross entropy's fp32 copy) of one micro-batch on a TP rank."""
    elements = (
        workload.seq_length * workload.micro_batch_size * workload.vocab_size
    ) // workload.parallelism.tp
    width = DTYPE_BYTES[workload.precision]
    fp32_copy = width != 4 and workload.cross_entropy_fp32_copy
    return elements * width, (elements * 4 if fp32_copy else 0)


def rank_peaks(
    workload: TrainingJob, counts: ParameterCounts, row: RowActivations, kinds: list[str]
) -> list[RankPeak]:
    """Every pipeline stage's moments over iteration 1 and a steady-state iteration, and its peak."""
    layout = workload.parallelism
    ranks_per_stage = workload.world_size // layout.pp
    peaks = []
    for stage in range(layout.pp):
        layers = [i for chunk in chunk_layers(len(kinds), layout, stage) for i in chunk]
        first, last = stage == 0, stage == layout.pp - 1
        dense, expert = counts.stage(layers, first, last, layout.pp)
        retained, transient, where = _stage_activations(workload, row, kinds, stage)
        moments: list[Moment] = []
        for iteration in (1, 2):
            persistent = persistent_bytes(workload, dense, expert, moments=iteration > 1)
            fixed = {**persistent, "workspace": CUBLAS_WORKSPACE_BYTES}
            moments.append(
                Moment(
                    iteration,
                    "forward/backward",
                    where,
                    {
                        **fixed,
                        "activations": round(retained),
                        "temporaries": round(transient),
                    },
                )
            )
            if last:
                logits, fp32_copy = logits_bytes(workload)
                head_input = _hidden_bytes(workload)
                moments.append(
                    Moment(
                        iteration,
                        "logits and cross entropy",
                        "output_layer",
                        {
                            **fixed,
                            "activations": round(retained) + head_input,
                            "temporaries": logits + fp32_copy,
                        },
                    )
                )
            after_step = persistent_bytes(workload, dense, expert, moments=True)
            width = DTYPE_BYTES[workload.precision]
            grad_copy = 0
            # MCore's optimizer copies 16-bit gradients to fp32 for its step; the precision-aware one
            # (bf16 moments) reads them as they are.
            if width != 4 and not workload.grad_reduce_in_fp32 and workload.moment_bytes == 4:
                dp, edp = (
                    (workload.data_parallel, workload.expert_data_parallel)
                    if workload.distributed_optimizer
                    else (1, 1)
                )
                grad_copy = 4 * dense // dp + 4 * expert // edp
            moments.append(
                Moment(
                    iteration,
                    "optimizer step",
                    "optimizer",
                    {**after_step, "workspace": CUBLAS_WORKSPACE_BYTES, "temporaries": grad_copy},
                )
            )
        peak = max(moments, key=lambda m: m.total)
        start = stage * ranks_per_stage
        peaks.append(RankPeak(stage, list(range(start, start + ranks_per_stage)), peak, moments))
    return peaks


def moment_json(moment: Moment) -> dict[str, Any]:
    return {
        "iteration": moment.iteration,
        "phase": moment.phase,
        "module": moment.module,
        "parts": dict(moment.parts),
    }
