"""What ``plan`` models: the model, its layout, batch, precision and the training settings that set
memory (the optimizer and gradient buffers), from a recipe or from Megatron-LM flags."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources

from harness.errors import UsageError
from harness.estimate.megatron_lm import MegatronLMRun
from harness.estimate.model import Architecture, architecture
from harness.run.recipes import Parallelism, Recipe

# Bytes an element of each parameter dtype takes.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# Training settings of the bridge recipes the harness ships, as Megatron Bridge's recipes set them
# (src/megatron/bridge/recipes/{moonlight,nemotronh}/...: `cfg.ddp`, `cfg.optimizer`,
# `cfg.mixed_precision`, `cross_entropy_fusion_impl`). Moonlight: distributed optimizer,
# precision-aware (fp32 main parameters, bf16 gradients and Adam moments), TE cross entropy (in place
# on the bf16 logits). Nemotron 3 Nano: distributed optimizer, bf16 gradients, fp32 main parameters
# and moments, MCore's native fused cross entropy (an fp32 copy of the logits). Both output layers are untied.
BRIDGE_TRAINING: dict[str, dict[str, object]] = {
    "moonlight_16b": {
        "distributed_optimizer": True,
        "grad_reduce_in_fp32": False,
        "precision_aware_optimizer": True,
        "optimizer_state_bytes": 4,
        "cross_entropy_fp32_copy": False,
    },
    # Llama3 70B SFT FP8 CS (perf_recipes/llama/h100/llama3.py): distributed optimizer, bf16
    # gradients (grad_reduce_in_fp32 False), fp32 main parameters and moments, TE cross entropy
    # (cross_entropy_loss_fusion with the "te" implementation), FP8 parameters (fp8_param_gather).
    "llama3_70b_sft_fp8cs": {
        "distributed_optimizer": True,
        "grad_reduce_in_fp32": False,
        "precision_aware_optimizer": False,
        "optimizer_state_bytes": 8,
        "cross_entropy_fp32_copy": False,
    },
    # Nemotron 3 Nano (nemotron_3_nano_pretrain_config = nemotron_3_nano_pretrain_8gpu_h100_bf16_config,
    # recipes/nemotronh/h100/nemotron_3_nano.py at 600d069b): `cfg.ddp.grad_reduce_in_fp32 = False`
    # and `cfg.mixed_precision.grad_reduce_in_fp32 = False`, so the DDP buffer holds bf16 gradients;
    # its `optimizer.main_grads_dtype = float32` is read only by the precision-aware optimizer, which
    # it turns off (fp32 main parameters and moments, the step's fp32 copy of the gradient shard).
    "nemotron_3_nano": {
        "distributed_optimizer": True,
        "grad_reduce_in_fp32": False,
        "precision_aware_optimizer": False,
        "optimizer_state_bytes": 8,
        "cross_entropy_fp32_copy": True,
    },
}


class Optimizer(StrEnum):
    """The optimizer a run builds, as memory sees it."""

    # Megatron Core's mixed-precision optimizer (``DistributedOptimizer`` /
    # ``Float16OptimizerWithFloat16Params``) behind its DDP: a contiguous gradient buffer allocated
    # with the model, fp32 main parameters, Adam moments allocated by the first step. Megatron-LM's
    # and Megatron Bridge's training loops.
    MEGATRON = "megatron"
    # The harness's ``mcore`` back end (harness/run/backend_mcore.py): ``torch.optim.AdamW`` over the
    # parameters as they are, built at iteration 1's step; ``p.grad`` in the parameter dtype, made
    # by backward and freed by ``zero_grad(set_to_none=True)`` after every step.
    TORCH_ADAMW = "torch-adamw"


@dataclass(frozen=True)
class TrainingJob:
    """One training job as memory sees it (per-rank shapes follow from these)."""

    name: str
    arch: Architecture
    world_size: int
    parallelism: Parallelism
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    precision: str  # parameter dtype: bf16, fp16, fp32
    vocab_size: int
    untie_embeddings: bool
    distributed_optimizer: bool
    grad_reduce_in_fp32: bool
    attention_backend: str  # the estimate's CPU core attention: fused / unfused
    fp8: str | None = None  # Megatron-LM --fp8-recipe when FP8 is on
    fp8_param: bool = False  # matrix-product weights kept in FP8 (--fp8-param-gather)
    # The optimizer's state per parameter made by its first step: Adam's exp_avg + exp_avg_sq (fp32:
    # 8; precision-aware bf16 moments: 4), SGD's momentum (4).
    optimizer_state_bytes: int = 8
    main_param_bytes: int = 4  # Megatron's main parameters of 16-bit training (fp32; fp16: 2)
    # Megatron's precision-aware optimizer reads 16-bit gradients as they are (no fp32 copy).
    precision_aware_optimizer: bool = False
    # MCore's cross entropy (native, fused or not) works on an fp32 copy of the logits; TE's works in
    # place on them.
    cross_entropy_fp32_copy: bool = True
    optimizer: Optimizer = Optimizer.MEGATRON
    # The causal mask the run keeps on the device for its whole life: the mcore back end's style
    # model builds one ``[1, 1, s, s]`` bool mask (harness.models.build.TinyModel); Megatron-LM's and
    # Bridge's data loaders hand one per batch.
    resident_causal_mask: bool = False
    # The GPU run's experts are Transformer Engine's TEGroupedMLP (MCore's TE spec with
    # moe_grouped_gemm), the only experts with a ``moe_act`` checkpoint; else SequentialMLP.
    grouped_experts: bool = True
    transformer_engine: bool = True  # the GPU run's layers are TE's (its own cuBLAS workspace)
    # The data loader hands each micro-batch a ``[b, 1, s, s]`` bool attention mask (Megatron-LM's
    # default, ``--no-create-attention-mask-in-dataloader`` to drop it).
    attention_mask_in_batch: bool = False
    position_embedding_type: str = "rope"  # learned_absolute adds max_position_embeddings x h
    max_position_embeddings: int | None = None  # None: the sequence length
    distributed_optimizer_instances: int = 1  # --num-distributed-optimizer-instances
    # Layers per virtual pipeline stage (chunk x PP + rank) of an uneven pipeline
    # (--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split);
    # None: MCore's even split.
    stage_layers: tuple[int, ...] | None = None
    # --defer-embedding-wgrad-compute: None off, else the deferral limit (0: every micro-batch)
    deferred_embedding_wgrad: int | None = None

    @property
    def local_seq_length(self) -> int:
        """The tokens of a sequence one rank runs: context parallelism splits the sequence over CP
        ranks (get_batch_on_this_cp_rank), so activations, logits and loss are of s / CP."""
        return self.seq_length // self.parallelism.cp

    @property
    def optimizer_shards(self) -> tuple[int, int]:
        """(dense, expert) ranks the distributed optimizer shards over: MCore's DDP reduce-scatters
        dense gradients over data parallel x context parallel (its DP-CP group), experts over
        expert data parallel; ``--num-distributed-optimizer-instances`` N shards within an
        instance, 1/N of each (the intra-instance groups)."""
        instances = self.distributed_optimizer_instances
        return (
            self.data_parallel * self.parallelism.cp // instances,
            max(1, self.expert_data_parallel // instances),
        )

    @property
    def sequence_parallel(self) -> bool:
        return self.parallelism.tp > 1

    @property
    def data_parallel(self) -> int:
        return self.parallelism.data_parallel(self.world_size)

    @property
    def expert_data_parallel(self) -> int:
        return self.parallelism.expert_data_parallel(self.world_size)

    @property
    def micro_batches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel)


# The HuggingFace config a bridge recipe's model is built from.
_BRIDGE_HF_CONFIGS = {
    "moonlight_16b": "moonlight-16b-a3b.json",
    "llama3_70b_sft_fp8cs": "llama3-70b.json",
}
# Megatron's vocabulary padding (``make_vocab_size_divisible_by``, Bridge's ``should_pad_vocab``).
VOCAB_DIVISIBLE_BY = 128


def _bridge_vocab(recipe: Recipe) -> tuple[int, bool]:
    """(vocabulary, untied) of a shipped bridge recipe's model. The Llama3 recipe pads its
    vocabulary (``should_pad_vocab``) to a multiple of 128 x TP, as Megatron does."""
    name = recipe.backend_options.get("recipe")
    if name in _BRIDGE_HF_CONFIGS:
        text = (
            resources.files("harness")
            .joinpath("data", "bridge", _BRIDGE_HF_CONFIGS[name])
            .read_text(encoding="utf-8")
        )
        hf = json.loads(text)
        vocab = int(hf["vocab_size"])
        if name == "llama3_70b_sft_fp8cs":
            multiple = VOCAB_DIVISIBLE_BY * recipe.parallelism.tp
            vocab = -(-vocab // multiple) * multiple
        return vocab, not hf["tie_word_embeddings"]
    return int(recipe.backend_options["vocab_size"]), True


def workload_from_recipe(recipe: Recipe) -> TrainingJob:
    """A GPU recipe's workload; a usage error for what the plan cannot model."""
    from harness.estimate.estimate import attention_backend_for

    where = f"recipe {recipe.name!r}"
    if recipe.device != "cuda":
        raise UsageError(f"{where} is a CPU recipe: plan models GPU recipes")
    if recipe.parallelism.cp != 1:
        raise UsageError(f"{where}: context parallel {recipe.parallelism.cp} is not modelled")
    arch = architecture(recipe)
    if recipe.backend == "bridge":
        training = BRIDGE_TRAINING[recipe.backend_options["recipe"]]
        vocab, untied = _bridge_vocab(recipe)
        distributed = bool(training["distributed_optimizer"])
        fp32_grads = bool(training["grad_reduce_in_fp32"])
        state_bytes = int(str(training["optimizer_state_bytes"]))
        precision_aware = bool(training["precision_aware_optimizer"])
        fp32_copy = bool(training["cross_entropy_fp32_copy"])
        optimizer, resident_mask = Optimizer.MEGATRON, False
        grouped = bool(arch.config.get("moe_grouped_gemm"))  # Bridge builds MCore's TE spec
        te = True
    else:
        # The mcore back end (harness/run/backend_mcore.py): its style model is built by
        # harness.models.build_model, which passes no share_embeddings_and_output_weights (MCore's
        # default: untied); torch.optim.AdamW keeps its moments in the parameter dtype and shards
        # nothing; GPTModel's own loss (vocab_parallel_cross_entropy: an fp32 copy of the logits).
        vocab = arch.style.vocab_size
        untied, distributed, fp32_grads = True, False, False
        state_bytes, precision_aware = 2 * DTYPE_BYTES[recipe.precision], False
        fp32_copy = True
        optimizer, resident_mask = Optimizer.TORCH_ADAMW, True
        # harness.models builds TEGroupedMLP from TE's spec where TE is installed, SequentialMLP
        # (where moe_act does nothing) without it; the one GPU run measured (docs/measured-gpu.md)
        # had no TE, and plan predicts that stack
        grouped = False
        te = False
    workload = TrainingJob(
        name=recipe.name,
        arch=arch,
        world_size=recipe.world_size,
        parallelism=recipe.parallelism,
        seq_length=recipe.seq_length,
        micro_batch_size=recipe.micro_batch_size,
        global_batch_size=recipe.global_batch_size,
        precision=recipe.precision,
        vocab_size=vocab,
        untie_embeddings=untied,
        distributed_optimizer=distributed,
        grad_reduce_in_fp32=fp32_grads,
        attention_backend=attention_backend_for(recipe, None),
        fp8=recipe.backend_options.get("fp8_recipe"),
        fp8_param=bool(recipe.backend_options.get("fp8_param", False)),
        optimizer_state_bytes=state_bytes,
        precision_aware_optimizer=precision_aware,
        cross_entropy_fp32_copy=fp32_copy,
        optimizer=optimizer,
        resident_causal_mask=resident_mask,
        grouped_experts=grouped,
        transformer_engine=te,
    )
    check_layout(workload, where)
    return workload


def workload_from_megatron_lm(run: MegatronLMRun) -> TrainingJob:
    """A Megatron-LM argument list's workload (Megatron-LM's training loop: Megatron's optimizer)."""
    workload = TrainingJob(
        name=run.name,
        arch=run.arch,
        world_size=run.world_size,
        parallelism=run.parallelism,
        seq_length=run.seq_length,
        micro_batch_size=run.micro_batch_size,
        global_batch_size=run.global_batch_size,
        precision=run.precision,
        vocab_size=run.vocab_size,
        untie_embeddings=run.untie_embeddings,
        distributed_optimizer=run.distributed_optimizer,
        grad_reduce_in_fp32=run.grad_reduce_in_fp32,
        attention_backend=run.attention_backend,
        fp8=run.fp8,
        fp8_param=run.fp8_param,
        optimizer_state_bytes=run.optimizer_state_bytes,
        main_param_bytes=run.main_param_bytes,
        precision_aware_optimizer=run.precision_aware_optimizer,
        cross_entropy_fp32_copy=run.cross_entropy_fp32_copy,
        grouped_experts=run.grouped_experts,
        transformer_engine=run.transformer_engine,
        attention_mask_in_batch=run.attention_mask_in_batch,
        position_embedding_type=run.position_embedding_type,
        max_position_embeddings=run.max_position_embeddings,
        distributed_optimizer_instances=run.distributed_optimizer_instances,
        stage_layers=run.stage_layers,
        deferred_embedding_wgrad=run.deferred_embedding_wgrad,
    )
    check_layout(workload, "Megatron-LM flags")
    return workload


def check_layout(workload: TrainingJob, where: str) -> None:
    """Refuse a layout MCore would refuse: sizes that do not divide the world or the layers."""
    layout = workload.parallelism
    world = workload.world_size
    if world % (layout.tp * layout.pp * layout.cp) or world % (
        layout.expert_tp * layout.ep * layout.pp
    ):
        raise UsageError(
            f"{where}: world size {world} is not a multiple of TP x PP x CP and ETP x EP x PP"
        )
    chunks = layout.pp * (layout.vpp or 1)
    if workload.stage_layers is None and workload.arch.config["num_layers"] % chunks:
        raise UsageError(
            f"{where}: {workload.arch.config['num_layers']} layers do not split evenly over "
            f"{chunks} pipeline chunks"
        )
    if workload.global_batch_size % (workload.micro_batch_size * workload.data_parallel):
        raise UsageError(
            f"{where}: global batch {workload.global_batch_size} is not a multiple of micro-batch "
            f"x data parallel ({workload.micro_batch_size} x {workload.data_parallel})"
        )
