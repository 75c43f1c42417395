"""The probe on a tensor-parallel group: every row on each rank of TP ``N`` with sequence parallel.

``probe --model NAME --tensor-parallel N`` starts ``N`` CPU ranks under torchrun (gloo,
``harness.probe.workers.rank_worker``, through ``harness.probe.workers.ranks``). Each rank joins MCore's parallel
state with TP ``N`` and runs the probe's own pass (``harness.probe.runner.probe_models``: the ``[]``
control, every selective label the model accepts, the combinations and the full rows, with the same
statuses and the same measurements) on models built with ``sequence_parallel`` on, as Megatron
requires for MoE under TP and as the GPU recipes run: the layers' activations are ``[s/tp, b, h]``
between the TP regions, the column- and row-parallel linears all-gather and reduce-scatter them.
MCore's local norm (``WrappedTorchNorm``) refuses SP only for its weight gradient's all-reduce; it
is built as the estimate builds it (``harness.models.sequence_parallel_norm``).

Every collective runs on staging copies (``harness.cpu.collectives.staged_collectives``): gloo's
worker thread releases a collective's tensors a moment after it completes, and that release, landing
inside a step at a scheduling-dependent moment, moved MemTracker's per-phase and per-module peaks
(and the ranks disagreed). With it, every value is the same from run to run.

The ranks must agree: every row's values on every rank are compared with rank 0's
(``rank_disagreements``), and a difference fails the probe, naming the rank, row and value. The
probe's result is then rank 0's, stated as every rank's (one golden per model and precision,
``cpu-probe-<model>[-fused][-bf16]-tp<N>-sp``). A refused layout (a width the TP size does not
divide, a size outside [2, 8], a hybrid model) is a UsageError before any rank starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from harness.cpu.adapter import init_cpu_parallel_state
from harness.cpu.collectives import staged_collectives
from harness.errors import UsageError
from harness.models import StyleModel, buildable_model
from harness.probe.runner import ModelProbe, ProbeRowResult, probe_models
from harness.probe.workers.ranks import RANKS_TIMEOUT_S, check_rank_count, run_probe_ranks

# The widths a TP group splits (MCore shards each one across the ranks), where a model sets them.
SPLIT_WIDTHS = (
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "ffn_hidden_size",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "linear_num_key_heads",
    "linear_num_value_heads",
)


def check_tensor_parallel(style: StyleModel, tp: int) -> None:
    """Refuse, before any rank starts, a layout the TP probe cannot build (UsageError)."""
    where = f"--tensor-parallel {tp} with {style.name}"
    check_rank_count("--tensor-parallel", tp, "TP rank")
    if style.hybrid_pattern:
        raise UsageError(
            f"{where}: a hybrid model's Mamba mixers run on CPU kernel stand-ins of one rank "
            "(harness/cpu/mamba_kernels.py); the TP probe builds GPT models"
        )
    widths = {"vocab_size": style.vocab_size, **style.config_kwargs}
    for name in ("vocab_size", *SPLIT_WIDTHS):
        value = widths.get(name)
        if value is not None and value % tp:
            raise UsageError(f"{where}: its {name} {value} does not split over {tp} ranks")


def probe_tensor_parallel(
    model: str,
    tp: int,
    *,
    precisions: Sequence[str] = ("fp32",),
    attention_backend: str = "unfused",
    timeout_s: float = RANKS_TIMEOUT_S,
) -> list[ModelProbe]:
    """The probe of ``model`` on ``tp`` torchrun ranks with sequence parallel, as every rank measured
    it, per precision (in ``precisions``' order; one job for all). A job that fails or hangs, or ranks
    that disagree, raise RuntimeError naming the cause."""
    check_tensor_parallel(buildable_model(model), tp)
    what = f"the TP {tp} + SP probe of {model} ({', '.join(precisions)}, {attention_backend})"
    per_precision = run_probe_ranks(
        model,
        "--tensor-parallel",
        tp,
        precisions=precisions,
        attention_backend=attention_backend,
        what=what,
        timeout_s=timeout_s,
    )
    for ranks in per_precision:
        disagreements = rank_disagreements(ranks)
        if disagreements:
            raise RuntimeError(f"{what}: the ranks disagree: {'; '.join(disagreements)}")
    return [ranks[0] for ranks in per_precision]


def _rank_values(row: ProbeRowResult) -> dict[str, Any]:
    """A row's values that every rank must share: all of them, except the size of the largest
    gradient difference (each rank compares its own shard's gradients; the count of differing
    values is shared, and it is what the goldens judge)."""
    values = row.as_dict()
    for key in ("equivalence", "dropout_equivalence"):
        if values[key] is not None:
            values[key] = {k: v for k, v in values[key].items() if k != "max_abs_grad_diff"}
    return values


def rank_disagreements(ranks: list[ModelProbe]) -> list[str]:
    """``rank r / label: key a -> b`` for every row value of a rank that is not rank 0's."""
    first = {row.label: _rank_values(row) for row in ranks[0].rows}
    lines = []
    for rank, probe in enumerate(ranks[1:], start=1):
        for row in probe.rows:
            theirs = first.get(row.label)
            if theirs is None:
                lines.append(f"rank {rank} / {row.label}: not on rank 0")
                continue
            lines += [
                f"rank {rank} / {row.label}: {key} {theirs.get(key)!r} -> {value!r}"
                for key, value in _rank_values(row).items()
                if theirs.get(key) != value
            ]
        if len(probe.rows) != len(ranks[0].rows):
            lines.append(f"rank {rank}: {len(probe.rows)} rows, rank 0 {len(ranks[0].rows)}")
    return lines


# --- on each rank (harness.probe.workers.rank_worker) -----------------------------------------------------


def rank_probe(
    model: str,
    tp: int,
    *,
    precision: str = "fp32",
    attention_backend: str = "unfused",
    seed: int = 1234,
    timeout_s: float = RANKS_TIMEOUT_S,
) -> ModelProbe:
    """This rank's probe of ``model`` on a TP ``tp`` group with sequence parallel (torchrun's
    environment): the probe's rows as ``probe_models`` runs them, the deadlock row aside (it is
    about ``CheckpointFunction``, not TP: the single-process probe runs it, isolated)."""
    check_tensor_parallel(buildable_model(model), tp)
    init_cpu_parallel_state(tp=tp, seed=seed, timeout_s=timeout_s)
    # Outside every measuring mode (harness.cpu.collectives): they see MCore's own tensors.
    with staged_collectives():
        (probe,) = probe_models(
            [model],
            hang_probe=False,
            seed=seed,
            attention_backend=attention_backend,
            precision=precision,
            sequence_parallel=True,
        )
    return dataclasses.replace(probe, tensor_parallel=tp)
