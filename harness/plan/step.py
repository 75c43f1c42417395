"""A rank's memory over iteration 1 and a steady-state iteration, moment by moment, and its peak.

Persistent bytes (from the real model's shard, ``harness.plan.parameters``), by the optimizer the
run builds (``workload.Optimizer``):

- ``megatron`` (Megatron Core's DDP and mixed-precision optimizer): parameters in their dtype (with
  the distributed optimizer MCore's DDP moves them into one contiguous buffer: the same bytes); the
  DDP gradient buffer, allocated with the model: fp32 with ``grad_reduce_in_fp32`` /
  ``--accumulate-allreduce-grads-in-fp32`` (Bridge's ``main_grads_dtype``), else the parameter dtype;
  fp32 main parameters for 16-bit training, allocated when the optimizer is built, and Adam's
  ``exp_avg`` / ``exp_avg_sq``, allocated lazily by the first ``step()``; the distributed optimizer
  shards all three over the data-parallel group (dense parameters) and the expert data-parallel
  group (expert parameters); with 16-bit gradients and fp32 moments the step also makes an fp32 copy
  of the (sharded) gradients.
- ``torch-adamw`` (the harness's ``mcore`` back end): parameters in their dtype; ``p.grad`` in the
  parameter dtype, made by backward (a parameter's gradient appears when its layer's backward runs)
  and freed by ``zero_grad(set_to_none=True)`` after every step, so a forward holds none; AdamW's
  ``exp_avg`` / ``exp_avg_sq`` in the parameter dtype (``zeros_like(p)``), made by iteration 1's
  ``step()``, nothing sharded. Its step is torch's ``foreach`` implementation (the default for CUDA
  parameters): every update is in place except ``torch._foreach_sqrt(exp_avg_sqs)``, one more
  parameter-sized list in the parameter dtype for the length of the step.

Buffers the run keeps for its whole life, beside the model (``buffers``):

- MCore's local core attention (``DotProductAttention``, the ``unfused`` back end) computes its
  ``[b * heads/tp, s, s]`` scores into ``get_global_memory_buffer().get_tensor(..., "mpu")``: one
  buffer in the parameter dtype, allocated by the first layer's forward and never freed (every layer
  reuses it: same name, dtype and shape);
- the mcore back end's style model keeps its ``[1, 1, s, s]`` bool causal mask on the device
  (``workload.resident_causal_mask``).

Moments, per iteration (iteration 1 holds no Adam moments until its step; a steady-state iteration
holds them throughout):

- ``forward/backward``: the stage's in-flight micro-batches' retained layers plus the row's transient
  (the layer's forward/backward peak, or a checkpoint's replay); under ``torch-adamw`` the gradients
  backward has made by then (the layers from the one whose backward holds the peak to the stage's
  last, and the output layer: backward runs them first);
- ``logits and cross entropy`` (last stage): the retained stage plus the output layer's logits
  ``[s, b, V/tp]`` in the parameter dtype and the fp32 copy cross entropy works in
  (``vocab_parallel_cross_entropy``: ``.float()``, then exp in place: the copy is what backward
  keeps), and the output layer's input;
- ``optimizer step``: the persistent bytes after the step, every gradient, plus the step's own
  temporaries (the fp32 gradient copy, or AdamW's square-root list).

Not seen, with the size assumed (``UNSEEN``): they are named in the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from harness.plan.activations import RowActivations
from harness.plan.parameters import ParameterCounts
from harness.plan.schedule import chunk_layers, in_flight_chunks
from harness.plan.workload import DTYPE_BYTES, Optimizer, TrainingJob

# cuBLAS workspaces, torch allocations (so in max_memory_allocated), 32 MiB each on Hopper: torch's,
# one per (cuBLAS handle, stream), and torch keeps a handle per thread, so one for the forward's
# thread and one for autograd's device thread that runs backward (both seen on the H200:
# tests/measured/gpu-memtrace-h200-20261204); Transformer Engine's own, one a process
# (transformer_engine/pytorch/module/base.py, get_cublas_workspace_size_bytes).
CUBLAS_WORKSPACE_BYTES = 32 * 1024 * 1024
TORCH_GEMM_THREADS = 2
UNSEEN = {
    "allocator fragmentation": "0 (max_memory_allocated counts allocated blocks, not reserved ones)",
    "NCCL buffers": "0 (NCCL allocates outside PyTorch's caching allocator)",
    "CUDA-graph private pools": "0 (static inputs/outputs of captured layers; Nemotron's attention "
    "and Mamba graphs keep them, the card calls them material)",
    "dispatcher buffers of alltoall / HybridEP": "as the CPU allgather dispatcher's (measured)",
    "cuBLAS / TE workspace": f"{CUBLAS_WORKSPACE_BYTES} bytes each: torch's forward and backward "
    "threads', TE's (counted)",
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


def parameter_bytes(workload: TrainingJob, elements: int, gemm: int) -> tuple[int, int]:
    """(parameters, FP8 weight workspaces) of ``elements`` parameters of which ``gemm`` are
    matrix-product weights. Transformer Engine under FP8: with ``fp8_param`` (``--fp8-param-gather``,
    Bridge's FP8 current scaling) those weights are FP8 tensors, one byte an element (MCore builds
    them under ``fp8_model_init``; a transpose for the backward GEMM is made per use where the
    parameter transpose cache is off, as those recipes set it); without it they stay in the
    parameter dtype and each TE module caches their FP8 copy across micro-batches, row-wise and
    column-wise (two bytes an element, kept for the step)."""
    width = DTYPE_BYTES[workload.precision]
    if workload.fp8 is None:
        return elements * width, 0
    if workload.fp8_param:
        return (elements - gemm) * width + gemm, 0
    return elements * width, 2 * gemm


def cublas_workspaces(workload: TrainingJob) -> int:
    """torch's cuBLAS workspaces (forward and backward threads) and, with TE, TE's."""
    return CUBLAS_WORKSPACE_BYTES * (TORCH_GEMM_THREADS + int(workload.transformer_engine))


def _sharding(workload: TrainingJob) -> tuple[int, int]:
    """(dense, expert) data-parallel sizes the optimizer state is sharded over (1: not sharded)."""
    if workload.optimizer is Optimizer.MEGATRON and workload.distributed_optimizer:
        return workload.optimizer_shards
    return 1, 1


def optimizer_bytes(workload: TrainingJob, dense: int, expert: int, *, moments: bool) -> int:
    """Optimizer state of a rank with ``dense`` + ``expert`` elements: main parameters (Megatron's,
    16-bit training) and, once the first step made them, Adam's two moments."""
    width = DTYPE_BYTES[workload.precision]
    megatron_16bit = workload.optimizer is Optimizer.MEGATRON and width != 4
    main = workload.main_param_bytes if megatron_16bit else 0
    per_param = main + (workload.optimizer_state_bytes if moments else 0)
    dp, edp = _sharding(workload)
    return round(Fraction(dense * per_param, dp) + Fraction(expert * per_param, edp))


def gradient_buffer_bytes(workload: TrainingJob, elements: int) -> int:
    """Megatron DDP's gradient buffer of ``elements`` parameters (0 under ``torch-adamw``: no buffer)."""
    if workload.optimizer is not Optimizer.MEGATRON:
        return 0
    return elements * (4 if workload.grad_reduce_in_fp32 else DTYPE_BYTES[workload.precision])


def resident_buffer_bytes(workload: TrainingJob) -> int:
    """MCore's global attention-score buffer (local core attention) and the causal mask: the mcore
    back end's, resident, or the data loader's of the micro-batch being run."""
    config = workload.arch.config
    scores = 0
    if workload.attention_backend == "unfused" and _has_attention(workload):
        heads = config["num_attention_heads"] // workload.parallelism.tp
        scores = (
            workload.micro_batch_size
            * heads
            * workload.seq_length**2
            * DTYPE_BYTES[workload.precision]
        )
    mask = workload.seq_length**2 if workload.resident_causal_mask else 0
    if workload.attention_mask_in_batch:  # a CP rank's rows of it: [b, 1, s / CP, s]
        mask += workload.micro_batch_size * workload.local_seq_length * workload.seq_length
    return scores + mask


def _has_attention(workload: TrainingJob) -> bool:
    from harness.estimate.model import ATTENTION, DENSE, MOE

    if workload.arch.style.hybrid_pattern:
        return ATTENTION in workload.arch.layer_kinds
    return bool({DENSE, MOE} & set(workload.arch.layer_kinds))


def _stage_activations(
    workload: TrainingJob, row: RowActivations, kinds: list[str], stage: int
) -> tuple[Fraction, Fraction, str]:
    """(retained over the in-flight micro-batches, transient, where) on ``stage`` under ``row``."""
    layout = workload.parallelism
    chunks = chunk_layers(len(kinds), layout, stage, workload.stage_layers)
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
    # an uneven split can leave a chunk without decoder layers (the embedding counted as one)
    held = [chunks[chunk] for chunk in in_flight if chunks[chunk]]
    last = held[-1][-1] if held else None
    where = "no decoder layer" if last is None else f"layer {last} ({kinds[last]})"
    return retained, transient, where


def _hidden_bytes(workload: TrainingJob) -> int:
    """One micro-batch's ``[s/tp, b, h]`` hidden state (sequence parallel), in the parameter dtype."""
    tp = workload.parallelism.tp if workload.sequence_parallel else 1
    return (
        workload.local_seq_length
        // tp
        * workload.micro_batch_size
        * workload.arch.config["hidden_size"]
        * DTYPE_BYTES[workload.precision]
    )


def deferred_wgrad_bytes(workload: TrainingJob, own: bool) -> int:
    """The output layer's deferred weight-gradient inputs on the last stage: with
    ``defer_embedding_wgrad_compute`` MCore's ColumnParallelLinear appends each micro-batch's input
    to ``embedding_activation_buffer`` and its backward appends the logits' gradient ``[s, b, V/tp]``
    to ``grad_output_buffer`` (tensor_parallel/layers.py), up to ``wgrad_deferral_limit``
    micro-batches (0: all), kept until the pipeline flush computes the weight gradient. At the last
    micro-batch's logits the earlier ones are held; in its backward (``own``) its own too."""
    limit = workload.deferred_embedding_wgrad
    if limit is None:
        return 0
    held = workload.micro_batches - (0 if own else 1)
    if limit:
        held = min(held, limit)
    return max(held, 0) * (_hidden_bytes(workload) + logits_bytes(workload)[0])


def logits_bytes(workload: TrainingJob) -> tuple[int, int]:
    """(logits in the parameter dtype, cross entropy's fp32 copy) of one micro-batch on a TP rank."""
    elements = (
        workload.local_seq_length * workload.micro_batch_size * workload.vocab_size
    ) // workload.parallelism.tp
    width = DTYPE_BYTES[workload.precision]
    fp32_copy = width != 4 and workload.cross_entropy_fp32_copy
    return elements * width, (elements * 4 if fp32_copy else 0)


def _gradients_made_by_peak(
    workload: TrainingJob,
    counts: ParameterCounts,
    row: RowActivations,
    layers: list[int],
    last: bool,
) -> int:
    """``torch-adamw``: the gradient bytes backward has made by the stage's activation peak: none
    if the peak is in forward; else the output layer's (and the tied embedding's, which the output
    layer uses) and those of the layers from the peak's to the stage's last (backward runs them
    first; the peak layer's own are counted whole: its weight gradients are made during its
    backward, where the peak is)."""
    if not row.peak_in_backward:
        return 0
    first = layers[-1] if row.peak_layer is None else row.peak_layer
    dense, expert = counts.stage([i for i in layers if i >= first], False, False, 1)
    head = (counts.head + (counts.embedding if counts.tied else 0)) if last else 0
    return (dense + expert + head) * DTYPE_BYTES[workload.precision]


def _step_temporaries(workload: TrainingJob, dense: int, expert: int) -> int:
    """What the optimizer step allocates for its length: Megatron's fp32 copy of 16-bit gradients
    (not for the precision-aware optimizer, which reads them as they are), or AdamW's square roots."""
    width = DTYPE_BYTES[workload.precision]
    if workload.optimizer is Optimizer.TORCH_ADAMW:
        return (dense + expert) * width  # the square roots of exp_avg_sq, in its dtype
    if width != 4 and not workload.grad_reduce_in_fp32 and not workload.precision_aware_optimizer:
        dp, edp = _sharding(workload)
        return 4 * dense // dp + 4 * expert // edp
    return 0


def rank_peaks(
    workload: TrainingJob, counts: ParameterCounts, row: RowActivations, kinds: list[str]
) -> list[RankPeak]:
    """Every pipeline stage's moments over iteration 1 and a steady-state iteration, and its peak."""
    layout = workload.parallelism
    ranks_per_stage = workload.world_size // layout.pp
    width = DTYPE_BYTES[workload.precision]
    buffers = resident_buffer_bytes(workload)
    peaks = []
    for stage in range(layout.pp):
        layers = [
            i
            for chunk in chunk_layers(len(kinds), layout, stage, workload.stage_layers)
            for i in chunk
        ]
        first, last = stage == 0, stage == layout.pp - 1
        dense, expert = counts.stage(layers, first, last, layout.pp)
        elements = dense + expert
        retained, transient, where = _stage_activations(workload, row, kinds, stage)
        parameters, fp8_workspaces = parameter_bytes(workload, elements, counts.stage_gemm(layers))
        fixed = {
            "parameters": parameters,
            "workspace": cublas_workspaces(workload) + fp8_workspaces,
            "buffers": buffers,
        }
        if workload.optimizer is Optimizer.MEGATRON:
            all_gradients = activation_gradients = gradient_buffer_bytes(workload, elements)
        else:
            all_gradients = elements * width
            activation_gradients = _gradients_made_by_peak(workload, counts, row, layers, last)
        deferred = deferred_wgrad_bytes(workload, own=True) if last else 0
        moments: list[Moment] = []
        for iteration in (1, 2):
            state = optimizer_bytes(workload, dense, expert, moments=iteration > 1)
            moments.append(
                Moment(
                    iteration,
                    "forward/backward",
                    where,
                    {
                        **fixed,
                        "gradients": activation_gradients,
                        "optimizer_state": state,
                        "activations": round(retained) + deferred,
                        "temporaries": round(transient),
                    },
                )
            )
            if last:
                logits, fp32_copy = logits_bytes(workload)
                moments.append(
                    Moment(
                        iteration,
                        "logits and cross entropy",
                        "output_layer",
                        {
                            **fixed,
                            "gradients": gradient_buffer_bytes(workload, elements),
                            "optimizer_state": state,
                            "activations": round(retained)
                            + _hidden_bytes(workload)
                            + deferred_wgrad_bytes(workload, own=False),
                            "temporaries": logits + fp32_copy,
                        },
                    )
                )
            moments.append(
                Moment(
                    iteration,
                    "optimizer step",
                    "optimizer",
                    {
                        **fixed,
                        "gradients": all_gradients,
                        "optimizer_state": optimizer_bytes(workload, dense, expert, moments=True),
                        "temporaries": _step_temporaries(workload, dense, expert),
                    },
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
