"""A rank's parameters, counted on the real Megatron Core model built on the meta device.

The model is MCore's own ``GPTModel`` (``HybridModel`` for a hybrid pattern) over the same local
spec the probe and ``estimate`` build, at full width, inside MCore's parallel state initialised on a
*fake* process group (torch's ``fake`` backend: a world of the layout's size in one process, no
communication), so tensor, expert and expert-tensor parallelism shard every weight exactly as on
the GPUs. ``torch.device("meta")`` makes it free: no bytes are allocated, shapes are MCore's.

The model is built once with the whole layer stack on one pipeline stage; a stage's parameters are
then its layers' (``decoder.layers.<i>.*``), plus the embedding on the first stage and the final
norm and output layer on the last (and, with tied embeddings under PP > 1, the embedding copy MCore
keeps there for the output layer).
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from harness.config.fields import CONTROL_ROW, RecomputeFields
from harness.errors import UsageError, exception_summary

if TYPE_CHECKING:
    from collections.abc import Iterator

    from harness.plan.workload import TrainingJob

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
# The weights of a layer's matrix products (MCore's linear_* modules, the experts' weight<i>):
# Transformer Engine's FP8 GEMM operands. Norms, biases, the router stay in the parameter dtype.
_GEMM_WEIGHT = re.compile(r"\.linear_\w+\.weight\d*$|\.weight\d+$")


@dataclass(frozen=True)
class ParameterCounts:
    """Elements of the rank's shard of each part of the model: ``dense`` parameters are reduced
    (and their optimizer state sharded) over the data-parallel group, ``expert`` ones over the
    expert data-parallel group (MCore marks them ``allreduce = False``)."""

    per_layer: tuple[tuple[int, int], ...]  # (dense, expert) per decoder layer
    embedding: int
    head: int  # final norm + output layer (0 for an output layer tied to the embedding)
    tied: bool
    gemm_per_layer: tuple[int, ...] = ()  # elements of each layer's matrix-product weights

    def stage_gemm(self, layers: list[int]) -> int:
        """Elements of the matrix-product weights of the decoder layers ``layers``."""
        return sum(self.gemm_per_layer[i] for i in layers)

    def stage(self, layers: list[int], first: bool, last: bool, pp: int) -> tuple[int, int]:
        """(dense, expert) elements of a pipeline stage holding ``layers``."""
        dense = sum(self.per_layer[i][0] for i in layers)
        expert = sum(self.per_layer[i][1] for i in layers)
        if first:
            dense += self.embedding
        if last:
            dense += self.head + (self.embedding if self.tied and pp > 1 else 0)
        return dense, expert


@contextmanager
def fake_parallel_state(workload: TrainingJob) -> Iterator[None]:
    """MCore's parallel state of the layout (PP 1: stages are composed afterwards) on a fake group."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from harness.cpu.adapter import enable_cpu_adapter, reseed

    layout = workload.parallelism
    world = workload.world_size // layout.pp
    enable_cpu_adapter()
    if dist.is_initialized() or ps.model_parallel_is_initialized():
        raise RuntimeError("plan builds its model in a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=1,
            context_parallel_size=layout.cp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.expert_tp,
            create_gloo_process_groups=False,
        )
        reseed(1234)  # MCore's RNG tracker: a Mamba mixer draws in the model-parallel stream
        yield
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def full_config(workload: TrainingJob, fields: RecomputeFields) -> Any:
    """The full model's real ``TransformerConfig`` under ``fields`` (the validator runs here); the
    fake parallel state must be running."""
    from harness.estimate.layers import DTYPES
    from harness.estimate.model import CPU_FLAGS
    from harness.models import transformer_config

    overrides: dict[str, Any] = {
        **CPU_FLAGS,
        "perform_initialization": False,
        "sequence_parallel": workload.sequence_parallel,
        "expert_tensor_parallel_size": workload.parallelism.expert_tp,
    }
    config = workload.arch.config
    overrides["hidden_dropout"] = config.get("hidden_dropout", 0.0)
    # A fused core attention keeps only an RNG seed for its dropout (the CPU one has none).
    fused = workload.attention_backend == "fused"
    overrides["attention_dropout"] = 0.0 if fused else config.get("attention_dropout", 0.0)
    return transformer_config(
        workload.arch.style, fields, dtype=DTYPES[workload.precision], **overrides
    )


def count_parameters(workload: TrainingJob) -> ParameterCounts:
    """Build the model on the meta device in the layout's fake parallel state and count its shard."""
    from megatron.core.models.gpt import GPTModel

    from harness.models import set_core_attention
    from harness.models.gdn import decoder_block_spec
    from harness.models.hybrid import build_hybrid_model

    style = workload.arch.style
    layout = workload.parallelism
    if layout.cp > 1:
        # Context parallelism shards no parameter (every CP rank of a stage holds its weights), and
        # the CPU core attention refuses CP: counted at CP 1 in the same world (TP, PP, EP and
        # ETP shard as before; the larger DP shards no parameter either).
        workload = dataclasses.replace(workload, parallelism=dataclasses.replace(layout, cp=1))
    with fake_parallel_state(workload):
        config = full_config(workload, RecomputeFields.parse(CONTROL_ROW))
        with torch.device("meta"), _refusal_as_usage_error():
            # Sequence parallelism and attention dropout make no parameter, and the torch norms
            # (a hybrid stack's, attention's q/k norms) refuse SP, the fused CPU attention
            # dropout: counted without both.
            unsplit = dataclasses.replace(config, sequence_parallel=False, attention_dropout=0.0)
            if style.hybrid_pattern:
                model = build_hybrid_model(style, unsplit, "fused", workload.seq_length)
            else:
                block_spec = decoder_block_spec(unsplit)
                set_core_attention(block_spec, workload.attention_backend, style.mla)
                model = GPTModel(
                    unsplit,
                    block_spec,
                    vocab_size=workload.vocab_size,
                    max_sequence_length=workload.max_position_embeddings or workload.seq_length,
                    position_embedding_type=workload.position_embedding_type,
                    share_embeddings_and_output_weights=not workload.untie_embeddings,
                )
        return _counts(model, config.num_layers, workload)


@contextmanager
def _refusal_as_usage_error() -> Iterator[None]:
    """Megatron Core refusing to build the model (an assertion or a value it rejects in a module's
    constructor) as one line naming the exception and its Megatron Core frame."""
    try:
        yield
    except (AssertionError, ValueError, TypeError, NotImplementedError) as refused:
        summary = exception_summary(refused)
        where = f" at {summary['where']}" if summary["where"] else ""
        raise UsageError(
            f"Megatron Core cannot build this model: {summary['type']}: {summary['message']}{where}"
        ) from None


def _counts(model: torch.nn.Module, layers: int, workload: TrainingJob) -> ParameterCounts:
    per_layer: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    gemm: dict[int, int] = defaultdict(int)
    embedding = head = 0
    vocab_rows = workload.vocab_size // workload.parallelism.tp
    for name, parameter in model.named_parameters():
        n = parameter.numel()
        match = _LAYER.match(name)
        if match:
            per_layer[int(match[1])][0 if getattr(parameter, "allreduce", True) else 1] += n
            if _GEMM_WEIGHT.search(name):
                gemm[int(match[1])] += n
        elif name.startswith("embedding."):
            embedding += n
        else:
            head += n
    # A hybrid model's vocabulary comes from its style (build_hybrid_model); the recipe's may differ
    # (Nemotron 3 Nano: 131072), so the embedding and output rows are the workload's.
    embedding_width = workload.arch.config["hidden_size"]
    if embedding:
        embedding = vocab_rows * embedding_width + (embedding - _word_rows(model) * embedding_width)
    output = _output_rows(model)
    if output:
        head += (vocab_rows - output) * embedding_width
    if len(per_layer) != layers:
        raise UsageError(f"the built model has {len(per_layer)} decoder layers, expected {layers}")
    return ParameterCounts(
        tuple((d, e) for _, (d, e) in sorted(per_layer.items())),
        embedding,
        head,
        tied=not workload.untie_embeddings,
        gemm_per_layer=tuple(gemm[i] for i in sorted(per_layer)),
    )


def _word_rows(model: torch.nn.Module) -> int:
    return int(model.embedding.word_embeddings.weight.shape[0])


def _output_rows(model: torch.nn.Module) -> int:
    weight = getattr(model.output_layer, "weight", None)
    return 0 if weight is None else int(weight.shape[0])
