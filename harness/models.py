"""Tiny "style" models built from Megatron Core's own specs: shaped like the real ones, small enough for CPU.

Every model is a real ``GPTModel`` from the local (non-TE) spec with the recompute fields under test,
except ``nemotron-h-tiny``: Megatron Core's ``HybridModel`` (Mamba, attention and MoE layers) over the
same local modules (``hybrid_stack_spec``). Components of ours are core attentions and the hybrid
stack's final norm (``_local_norm_hybrid_stack``: MCore builds it as ``TENorm`` unconditionally); the
Mamba mixer's CUDA kernels are the CPU adapter's stand-ins (harness/cpu/mamba_kernels.py), as are
the fla kernels of ``gdn-tiny``'s Gated DeltaNet and ``gdp-tiny``'s GatedDeltaProduct (MCore's layers;
harness/cpu/linear_attention.py); ``gdp-tiny`` is a ``HybridModel`` too.
``KVChannelsDotProductAttention``: MCore's MLA builds its core attention with ``k_channels`` /
``v_channels``, which the local ``DotProductAttention`` does not accept; ours accepts them so MCore's
MLA projection code (where ``mla_up_proj`` lives) runs unmodified. ``FusedCoreAttention`` (harness/cpu/attention.py) for ``attention_backend="fused"``.

``build_model`` is device-agnostic: the CPU probe calls it after ``enable_cpu_adapter()``; the runner's
``mcore`` back end calls it on CPU (under the adapter) and with ``device="cuda"`` on GPU.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import types
from dataclasses import dataclass
from typing import Any

import torch
from megatron.core.activations import squared_relu

from harness.config.fields import RecomputeFields
from harness.cpu.attention import ATTENTION_BACKENDS, fused_core_attention
from harness.cpu.deferred_compile import eager_form
from harness.errors import UsageError
from harness.matrix.space import GATED_DELTA_NET


@dataclass(frozen=True)
class StyleModel:
    """One tiny model shape: TransformerConfig keyword arguments plus its batch geometry."""

    name: str
    description: str
    config_kwargs: dict[str, Any]
    vocab_size: int = 128
    seq_length: int = 32
    micro_batch_size: int = 2
    mla: bool = False
    # Decoder layers with mHC residual streams (HyperConnectionTransformerLayer, Megatron Core 0.20 /
    # main): Megatron Core's layer specs never build them, so build_model swaps them in.
    hyper_connections: bool = False
    # Trailing tokens of every sequence masked out of the loss (a padding mask: the batch carries a
    # ``loss_mask``, which the MTP block reads too).
    padding_tokens: int = 0
    # A hybrid model's layer pattern (Megatron Core's symbols: M Mamba, * attention, E MoE, - MLP):
    # built as MCore's HybridModel over local-spec layers (build_hybrid_model) instead of a GPTModel.
    hybrid_pattern: str = ""
    # The hybrid's M layers are GatedDeltaProduct mixers (MCore's gdp stack spec) instead of Mamba-2.
    gated_delta_product: bool = False

    @property
    def layers(self) -> int:
        """Transformer layers of the whole model (a pipeline stage builds its share of them)."""
        return self.config_kwargs["num_layers"]


_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "normalization": "RMSNorm",
    "add_bias_linear": False,  # selective `mlp` with biases deadlocks in backward: see the hang probe
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
}
_DENSE: dict[str, Any] = {
    "ffn_hidden_size": 128,
    "num_query_groups": 2,
    "gated_linear_unit": True,
    "activation_func": torch.nn.functional.silu,
}
_MOE: dict[str, Any] = {
    "num_moe_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "moe_token_dispatcher_type": "allgather",
    "moe_router_load_balancing_type": "aux_loss",
    "moe_aux_loss_coeff": 1e-2,
}

STYLE_MODELS: dict[str, StyleModel] = {
    model.name: model
    for model in (
        StyleModel(
            name="dense-tiny",
            description="standard attention + dense SwiGLU MLP, RMSNorm, 2 layers (Llama-style)",
            config_kwargs={**_COMMON, **_DENSE, "num_layers": 2},
        ),
        StyleModel(
            name="dense-deep",
            description=(
                "dense-tiny's layers, 4 deep: full recompute's uniform and block differ at "
                "recompute_num_layers 1, 2 and 4, and 3 does not divide the layers"
            ),
            config_kwargs={**_COMMON, **_DENSE, "num_layers": 4},
        ),
        StyleModel(
            name="mtp-tiny",
            description=(
                "dense-tiny with one Multi-Token Prediction layer (mtp_num_layers 1, the MTP "
                "block from MCore's own spec) and a padding mask (the last 8 tokens of each "
                "sequence out of the loss): full recompute over the decoder and the MTP layer"
            ),
            config_kwargs={**_COMMON, **_DENSE, "num_layers": 2, "mtp_num_layers": 1},
            padding_tokens=8,
        ),
        StyleModel(
            name="mhc-tiny",
            description=(
                "dense-tiny with manifold-constrained hyper-connections (4 residual streams, "
                "HyperConnectionTransformerLayer): the model of the mhc label; a Megatron Core "
                "that has them (0.20 / main) only"
            ),
            config_kwargs={**_COMMON, **_DENSE, "num_layers": 2, "enable_mhc_connections": True},
            hyper_connections=True,
        ),
        StyleModel(
            name="gdn-tiny",
            description=(
                "Qwen3-Next style: Gated DeltaNet linear attention mixed with standard attention "
                "(experimental_attention_variant gated_delta_net, linear_attention_freq 2: GDN "
                "then attention), dense SwiGLU MLP, RMSNorm, 2 layers; the GDN layer from MCore's "
                "own module spec, its fla kernels CPU stand-ins"
            ),
            config_kwargs={
                **_COMMON,
                **_DENSE,
                "num_layers": 2,
                **GATED_DELTA_NET,
            },
        ),
        StyleModel(
            name="moonlight-tiny",
            description=(
                "Moonlight/DeepSeek-V3 style: Multi-Latent Attention (q_lora_rank None; no "
                "latent KV norm: 0.19.2 cannot build it from the local spec) + MoE with shared "
                "experts and the grouped-GEMM flag, first layer dense (moe_layer_freq "
                "[0,1,1]), RMSNorm, SwiGLU, 3 layers"
            ),
            config_kwargs={
                **_COMMON,
                **_MOE,
                "num_layers": 3,
                "ffn_hidden_size": 128,
                "moe_layer_freq": [0, 1, 1],
                "moe_grouped_gemm": True,
                "gated_linear_unit": True,
                "activation_func": torch.nn.functional.silu,
                "multi_latent_attention": True,
                "q_lora_rank": None,
                "kv_lora_rank": 32,
                "qk_head_dim": 16,
                "qk_pos_emb_head_dim": 8,
                "v_head_dim": 16,
                "rope_type": "rope",
            },
            mla=True,
        ),
        StyleModel(
            name="nemotron-tiny",
            description=(
                "attention + MoE (shared experts, squared-ReLU, grouped-GEMM flag) part of "
                "the Nemotron-H pattern, 2 layers, on the alltoall token dispatcher (the CPU "
                "relative of the recipe's HybridEP / flex); the Mamba layers are left out here "
                "(nemotron-h-tiny has them, on the CPU stand-ins of their CUDA kernels)"
            ),
            config_kwargs={
                **_COMMON,
                **_MOE,
                # The MoE rows are measured on both dispatchers: moonlight-tiny keeps allgather
                # (its EP 2 torchrun sweep runs on gloo), nemotron-tiny runs alltoall (its side
                # stream: the CPU adapter's part 7).
                "moe_token_dispatcher_type": "alltoall",
                "num_layers": 2,
                "ffn_hidden_size": 128,
                "num_query_groups": 2,
                "gated_linear_unit": False,
                "moe_grouped_gemm": True,
                # MCore wraps squared_relu in torch.compile (jit_fuser); inductor's C++
                # build takes ~25 s on CPU. The same function, unwrapped, runs eagerly (and
                # unlike torch.compiler.disable does not import TorchDynamo).
                "activation_func": inspect.unwrap(squared_relu),
            },
        ),
        StyleModel(
            name="nemotron-h-tiny",
            description=(
                "Nemotron-H / Nemotron 3 Nano style hybrid: MCore's HybridModel with the pattern "
                "M*EME (Mamba-2 mixers, one attention layer, MoE with shared experts and "
                "squared-ReLU), no position embedding, RMSNorm; the Mamba kernels are the CPU "
                "stand-ins of harness/cpu/mamba_kernels.py"
            ),
            config_kwargs={
                **_COMMON,
                **_MOE,
                "num_layers": 5,
                "ffn_hidden_size": 128,
                "num_query_groups": 2,
                "gated_linear_unit": False,
                "moe_grouped_gemm": True,
                "activation_func": inspect.unwrap(squared_relu),  # as nemotron-tiny
                "is_hybrid_model": True,
                # d_inner = 2 · 64 = 128: 8 heads of 16 in 2 groups, state 16.
                "mamba_state_dim": 16,
                "mamba_head_dim": 16,
                "mamba_num_groups": 2,
            },
            hybrid_pattern="M*EME",
        ),
        StyleModel(
            name="gdp-tiny",
            description=(
                "GatedDeltaProduct hybrid: MCore's HybridModel with the pattern M*E whose M layer "
                "is a GatedDeltaProductMixer (2 Householder steps per token, as MCore's gdp stack "
                "spec), then attention and MoE with shared experts; its fla / causal-conv1d / "
                "mamba-ssm kernels are CPU stand-ins; a Megatron Core that has it (main) only"
            ),
            config_kwargs={
                **_COMMON,
                **_MOE,
                "num_layers": 3,
                "ffn_hidden_size": 128,
                "num_query_groups": 2,
                "gated_linear_unit": False,
                "moe_grouped_gemm": True,
                "activation_func": inspect.unwrap(squared_relu),
                "is_hybrid_model": True,
                # d_inner = 4 heads of 16; q/k of 16 in 2 groups.
                "mamba_state_dim": 16,
                "mamba_head_dim": 16,
                "mamba_num_groups": 2,
                "mamba_num_heads": 4,
                "gdp_num_householder": 2,
            },
            hybrid_pattern="M*E",
            gated_delta_product=True,
        ),
    )
}


def style_model(name: str) -> StyleModel:
    try:
        return STYLE_MODELS[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; known: {', '.join(STYLE_MODELS)}") from None


_GDP_MODULE = "megatron.core.ssm.gated_delta_product"


def not_on_this_tree(style: StyleModel) -> str:
    """Why the imported Megatron Core cannot build ``style`` ("" when it can)."""
    if style.hyper_connections and _hyper_connection_classes() is None:
        return "this Megatron Core has no HyperConnectionTransformerLayer (mHC: 0.20 / main)"
    if style.gated_delta_product and importlib.util.find_spec(_GDP_MODULE) is None:
        return f"this Megatron Core has no GatedDeltaProduct ({_GDP_MODULE}: main)"
    if style.config_kwargs.get("mtp_num_layers"):
        return _mtp_needs_transformer_engine()
    return ""


def _mtp_needs_transformer_engine() -> str:
    """The head's ``MultiTokenPredictionLayer`` asks ``is_inference_column_parallel_linear`` about its
    projection, an ``isinstance`` against Transformer Engine classes that are not types without TE:
    the layer cannot be built there. Asked of the function itself, so a fixed tree builds again."""
    try:
        inference = importlib.import_module("megatron.core.tensor_parallel.inference_layers")
        inference.is_inference_column_parallel_linear(None)
    except (ImportError, AttributeError):
        return ""  # older trees: the MTP layer asks no such thing
    except TypeError as exc:
        return (
            "requires-TE: this Megatron Core's MultiTokenPredictionLayer cannot be built without "
            f"Transformer Engine (is_inference_column_parallel_linear: TypeError: {exc})"
        )
    return ""


def buildable_models() -> list[str]:
    """The style models the imported Megatron Core can build: what ``probe --all`` probes."""
    return [name for name, style in STYLE_MODELS.items() if not not_on_this_tree(style)]


def not_probed_lines() -> list[str]:
    """``not probed here: <model>: <why>`` for each style model the imported Megatron Core cannot
    build: what ``probe --all`` and ``bump`` say they left out."""
    return [
        f"not probed here: {name}: {why}"
        for name, style in STYLE_MODELS.items()
        if (why := not_on_this_tree(style))
    ]


def buildable_model(name: str) -> StyleModel:
    """``style_model(name)``, refused in one line where this Megatron Core cannot build it."""
    style = style_model(name)
    missing = not_on_this_tree(style)
    if missing:
        raise UsageError(f"model {name!r} cannot be built here: {missing}")
    return style


def _hyper_connection_classes() -> tuple[type, type] | None:
    # By name: the oldest supported Megatron Core (and the type checker's) has neither.
    try:
        connection = importlib.import_module("megatron.core.transformer.hyper_connection")
        layer = importlib.import_module("megatron.core.transformer.transformer_layer")
        return layer.HyperConnectionTransformerLayer, connection.HyperConnectionModule
    except (ImportError, AttributeError):
        return None


def _use_hyper_connections(block_spec: Any) -> None:
    """Every layer of ``block_spec`` as a ``HyperConnectionTransformerLayer`` with a
    ``HyperConnectionModule`` around attention and MLP (the layer refuses to build without both)."""
    classes = _hyper_connection_classes()
    assert classes is not None, "build_model refuses the model first (buildable_model)"
    layer, connection = classes
    for spec in block_spec.layer_specs:
        spec.module = layer
        spec.submodules.self_attention_hyper_connection = connection
        spec.submodules.mlp_hyper_connection = connection


def _decoder_block_spec(config: Any) -> Any:
    """MCore's local decoder block spec for ``config``; with a linear-attention variant, MCore's own
    Gated DeltaNet spec in the layers ``linear_attention_freq`` gives it.

    MCore builds that mix only from Transformer Engine specs: its local spec refuses a config with an
    attention variant, so the local layers are built from the config without it (a copy: the
    validated config itself is untouched) and the GDN layers from ``get_gated_delta_net_module_spec``
    with the local back end. That back end has no fused norm + linear, so the GDN input projection is
    its plain column-parallel linear and the layer keeps its own input norm (as TE's fused one would
    compute it).
    """
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    variant = config.experimental_attention_variant
    plain = copy.copy(config)
    plain.experimental_attention_variant = None
    block_spec = get_gpt_decoder_block_spec(
        plain, use_transformer_engine=False, normalization=config.normalization
    )
    if variant is None:
        return block_spec
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_gated_delta_net_module_spec,
        get_linear_attention_pattern,
    )

    local = LocalSpecProvider()
    gdn = get_gated_delta_net_module_spec(config, backend=local)
    gdn.submodules.in_proj = local.column_parallel_linear()
    pattern = get_linear_attention_pattern(config)
    # The local spec shares one layer spec between layers: each GDN layer gets a copy of its own.
    for index, (layer_spec, linear) in enumerate(zip(block_spec.layer_specs, pattern, strict=True)):
        if linear:
            block_spec.layer_specs[index] = layer_spec = copy.deepcopy(layer_spec)
            layer_spec.submodules.self_attention = gdn
    return block_spec


def sequence_parallel_norm(
    config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any
) -> torch.nn.Module:
    """MCore's ``WrappedTorchNorm`` on a sequence-parallel model: built with SP off, its weights
    marked ``sequence_parallel``. ``WrappedTorchNorm`` refuses SP only because its weight gradient
    then needs the TP all-reduce (MCore's ``finalize_model_grads`` does it for parameters marked so,
    after the step); a norm is per token, so on the ``[s/tp, b, h]`` shard it saves exactly what it
    saves without SP."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    local = copy.copy(config)
    local.sequence_parallel = False
    norm = WrappedTorchNorm(config=local, hidden_size=hidden_size, eps=eps, **kwargs)
    for parameter in norm.parameters():
        parameter.sequence_parallel = True
    return norm


def _sequence_parallel_norms(block_spec: Any) -> None:
    """Every ``WrappedTorchNorm`` of a local decoder block spec (the layers' input and pre-MLP
    norms, the block's final norm) built as ``sequence_parallel_norm``."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    for spec in (*block_spec.layer_specs, block_spec):
        submodules = getattr(spec, "submodules", spec)
        for name in ("input_layernorm", "pre_mlp_layernorm", "layer_norm"):
            if getattr(submodules, name, None) is WrappedTorchNorm:
                setattr(submodules, name, sequence_parallel_norm)


def _run_linear_attention_helpers_eagerly(module: torch.nn.Module) -> None:
    """On CPU, the ``torch.compile``d (``jit_fuser``) methods of MCore's SSM-family layers (the Gated
    DeltaNet's gated norm, kernel-input preparation, decay and beta) run eagerly on each layer: the
    same functions, without Inductor's C++ builds (seconds per helper, dtype and grad mode), as
    nemotron-tiny's squared ReLU. Autograd then keeps what eager PyTorch keeps in those helpers."""
    for layer in module.modules():
        if not type(layer).__module__.startswith("megatron.core.ssm."):
            continue
        for cls in type(layer).__mro__:
            for name, attribute in vars(cls).items():
                eager = eager_form(attribute)
                if eager is not None and name not in vars(layer):
                    setattr(layer, name, types.MethodType(eager, layer))


def kv_channels_dot_product_attention() -> type:
    """The local ``DotProductAttention`` that also takes MLA's ``k_channels`` / ``v_channels``.

    MCore's local attention math is dimension-agnostic except for the output width, which it derives
    from ``kv_channels``; here it comes from ``v_channels`` as MLA requires.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class KVChannelsDotProductAttention(DotProductAttention):
        def __init__(
            self,
            *args: Any,
            k_channels: int | None = None,
            v_channels: int | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            if v_channels is not None:
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    return KVChannelsDotProductAttention


@dataclass
class TinyModel:
    """A built style model plus the batch it trains on."""

    style: StyleModel
    module: torch.nn.Module
    config: Any  # megatron.core TransformerConfig
    seq_length: int
    micro_batch_size: int
    device: torch.device

    def __post_init__(self) -> None:
        # The causal mask (True = masked) and positions are the same for every batch: built once, on the
        # model's device. Rebuilt per micro-batch they cost a seq² triu on the host and a host-to-device
        # copy inside every timed step (70-90 ms at seq 4096 on one CPU thread).
        self._causal = torch.triu(
            torch.ones(self.seq_length, self.seq_length, dtype=torch.bool, device=self.device),
            diagonal=1,
        )[None, None]
        self._positions = (
            torch.arange(self.seq_length, device=self.device)
            .expand(self.micro_batch_size, -1)
            .contiguous()
        )

    def batch(self, seed: int = 0) -> dict[str, torch.Tensor]:
        """Deterministic tokens and labels (drawn on the host: the same on every device), positions and
        the causal mask (True = masked)."""
        generator = torch.Generator().manual_seed(seed)
        shape = (self.micro_batch_size, self.seq_length + 1)
        tokens = torch.randint(0, self.style.vocab_size, shape, generator=generator).to(self.device)
        batch = {
            "input_ids": tokens[:, :-1].contiguous(),
            "position_ids": self._positions,
            "attention_mask": self._causal,
            "labels": tokens[:, 1:].contiguous(),
        }
        if self.style.padding_tokens:
            loss_mask = torch.ones(self.micro_batch_size, self.seq_length, device=self.device)
            loss_mask[:, self.seq_length - self.style.padding_tokens :] = 0
            batch["loss_mask"] = loss_mask
        return batch

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean token loss (over the tokens the loss mask keeps, when the batch has one): the scalar
        the probe differentiates. The MTP block adds its own loss to the graph through the mask."""
        loss_mask = batch.get("loss_mask")
        per_token = self.module(
            batch["input_ids"],
            batch["position_ids"],
            batch["attention_mask"],
            labels=batch["labels"],
            **({} if loss_mask is None else {"loss_mask": loss_mask}),
        )
        if loss_mask is None:
            return per_token.float().mean()
        return (per_token.float() * loss_mask).sum() / loss_mask.sum()


def _parallel_sizes(has_experts: bool) -> dict[str, int]:
    """The model-parallel sizes of the running MCore parallel state (the config must agree with it)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return {}
    sizes = {
        "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
        "context_parallel_size": ps.get_context_parallel_world_size(),
    }
    if has_experts:
        sizes["expert_model_parallel_size"] = ps.get_expert_model_parallel_world_size()
    return sizes


def _pipeline_stage_ends() -> dict[str, bool]:
    """Under pipeline parallelism, whether this rank's stage holds the embedding (``pre_process``) and
    the output layer and loss (``post_process``), as a training script's model provider asks MCore's
    parallel state; nothing (GPTModel's defaults: the whole model) on one stage."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_pipeline_model_parallel_world_size() == 1:
        return {}
    return {
        "pre_process": ps.is_pipeline_first_stage(),
        "post_process": ps.is_pipeline_last_stage(),
    }


def transformer_config(
    style: StyleModel,
    fields: RecomputeFields,
    *,
    dropout: bool = False,
    add_bias_linear: bool | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    **overrides: Any,
) -> Any:
    """The real ``TransformerConfig`` (``MLATransformerConfig`` for MLA); its validator runs here."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kwargs = dict(style.config_kwargs)
    if add_bias_linear is not None:
        kwargs["add_bias_linear"] = add_bias_linear
    kwargs.update(_parallel_sizes(has_experts="num_moe_experts" in kwargs))
    kwargs.update(
        hidden_dropout=0.1 if dropout else 0.0,
        attention_dropout=0.1 if dropout else 0.0,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=torch.device(device).type == "cpu",
        **fields.as_config_kwargs(),
    )
    kwargs.update(overrides)
    return (MLATransformerConfig if style.mla else TransformerConfig)(**kwargs)


def _fit_moe_metrics_tracker(num_layers: int) -> None:
    """MCore keeps the routers' aux-loss metrics in one process-global tracker whose per-layer tensors
    are sized by the first model that records into it; a model of another depth built later in the same
    process (the probe, a test worker) would index past them. Such a tracker is dropped; one of the
    right size is kept, as a training process keeps it warm after its first step (so counts of replayed
    operators never depend on which model a process built before)."""
    try:
        from megatron.core.transformer.moe.moe_logging import (
            destroy_moe_metrics_tracker,
            get_moe_metrics_tracker,
        )
    except ImportError:  # trees before Megatron-LM #3431 (main of early 2026) keep no such tracker
        return

    if any(
        entry.values.numel() != num_layers for entry in get_moe_metrics_tracker().metrics.values()
    ):
        destroy_moe_metrics_tracker()


def core_attention_class(backend: str, mla: bool) -> type | None:
    """The core-attention class a layer spec gets for ``backend``; None keeps MCore's local default."""
    if backend not in ATTENTION_BACKENDS:
        raise UsageError(
            f"unknown attention backend {backend!r}; known: {', '.join(ATTENTION_BACKENDS)}"
        )
    if backend == "fused":
        return fused_core_attention()
    return kv_channels_dot_product_attention() if mla else None


def set_core_attention(block_spec: Any, backend: str, mla: bool) -> None:
    """Put ``backend``'s core attention into every layer spec of ``block_spec`` that has one (a Gated
    DeltaNet layer has none: its attention is the delta rule)."""
    attention_class = core_attention_class(backend, mla)
    if attention_class is not None:
        for layer_spec in block_spec.layer_specs:
            submodules = layer_spec.submodules.self_attention.submodules
            if hasattr(submodules, "core_attention"):
                submodules.core_attention = attention_class


def build_model(
    name: str,
    fields: RecomputeFields,
    *,
    dropout: bool = False,
    seq_length: int | None = None,
    micro_batch_size: int | None = None,
    add_bias_linear: bool | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 1234,
    attention_backend: str = "unfused",
    **config_overrides: Any,
) -> TinyModel:
    """Build style model ``name`` with the given recompute fields (model-parallel state must exist).

    ``attention_backend`` (harness.cpu.attention): ``unfused`` is MCore's local core attention,
    ``fused`` a CPU core attention that keeps what fused/flash attention keeps (attention dropout
    is then off: the CPU flash kernel has none).

    Raises ``UsageError`` for an unknown name or nonsense sizes; the validator's own exception
    (AssertionError / ValueError) for recompute fields it rejects.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    style = buildable_model(name)
    seq_length = style.seq_length if seq_length is None else seq_length
    micro_batch_size = style.micro_batch_size if micro_batch_size is None else micro_batch_size
    for label, value in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 20:
            raise UsageError(f"{label} must be an integer in [1, 1048576], got {value!r}")
    if attention_backend == "fused":
        config_overrides.setdefault("attention_dropout", 0.0)
    config = transformer_config(
        style,
        fields,
        dropout=dropout,
        add_bias_linear=add_bias_linear,
        dtype=dtype,
        device=device,
        **config_overrides,
    )
    _fit_moe_metrics_tracker(config.num_layers)
    if style.hybrid_pattern:
        torch.manual_seed(seed)
        module = build_hybrid_model(style, config, attention_backend, seq_length)
        module.to(device)
        return TinyModel(style, module, config, seq_length, micro_batch_size, torch.device(device))
    block_spec = _decoder_block_spec(config)
    set_core_attention(block_spec, attention_backend, style.mla)
    if config.sequence_parallel:
        _sequence_parallel_norms(block_spec)
    if style.hyper_connections:
        _use_hyper_connections(block_spec)
    mtp: dict[str, Any] = {}
    if config.mtp_num_layers:
        mtp["mtp_block_spec"] = get_gpt_mtp_block_spec(
            config, block_spec, use_transformer_engine=False
        )
    torch.manual_seed(seed)
    module = GPTModel(
        config,
        block_spec,
        vocab_size=style.vocab_size,
        max_sequence_length=seq_length,
        position_embedding_type="rope",
        **mtp,
        **_pipeline_stage_ends(),
    )
    _run_linear_attention_helpers_eagerly(module)
    module.to(device)
    return TinyModel(style, module, config, seq_length, micro_batch_size, torch.device(device))


def hybrid_stack_spec(
    config: Any, attention_backend: str, gated_delta_product: bool = False
) -> Any:
    """Megatron Core's hybrid stack spec (``hybrid_layer_specs.hybrid_stack_spec``) with local modules.

    MCore ships that spec for Transformer Engine only (its layers' norms are fused into
    ``TELayerNormColumnParallelLinear``). The same layer classes are built here from the local
    provider, as ``get_gpt_layer_local_spec`` builds a GPT layer: the Mamba layer gets its own input
    norm and plain column/row-parallel projections around MCore's ``MambaMixer``; the attention,
    MLP and MoE layers are the local GPT layer's attention half, dense MLP half and MoE half
    (``TransformerLayer``, ``MLPLayer`` and ``MoETransformerLayer``, as in the TE spec). ``attention_backend`` picks the core attention;
    ``gated_delta_product`` puts a ``GatedDeltaProductMixer`` in the Mamba layer instead.
    """
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.models.hybrid.hybrid_block import HybridStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import (
        MoETransformerLayer,
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    dense = get_gpt_layer_local_submodules(normalization=config.normalization)
    moe = get_gpt_layer_local_submodules(
        num_experts=config.num_moe_experts,
        moe_grouped_gemm=config.moe_grouped_gemm,
        normalization=config.normalization,
    )
    attention_class = core_attention_class(attention_backend, mla=False)
    if attention_class is not None:
        dense.self_attention.submodules.core_attention = attention_class
    return ModuleSpec(
        module=_local_norm_hybrid_stack(),
        submodules=HybridStackSubmodules(
            mamba_layer=ModuleSpec(
                module=MambaLayer,
                submodules=MambaLayerSubmodules(
                    norm=dense.input_layernorm,
                    mixer=_mixer_spec(gated_delta_product),
                    mamba_bda=get_bias_dropout_add,
                ),
            ),
            attention_layer=ModuleSpec(
                module=TransformerLayer,
                submodules=TransformerLayerSubmodules(
                    input_layernorm=dense.input_layernorm,
                    self_attention=dense.self_attention,
                    self_attn_bda=get_bias_dropout_add,
                ),
            ),
            mlp_layer=ModuleSpec(
                module=MLPLayer,
                submodules=TransformerLayerSubmodules(
                    pre_mlp_layernorm=dense.pre_mlp_layernorm,
                    mlp=dense.mlp,
                    mlp_bda=get_bias_dropout_add,
                ),
            ),
            moe_layer=ModuleSpec(
                module=MoETransformerLayer,
                submodules=TransformerLayerSubmodules(
                    pre_mlp_layernorm=moe.pre_mlp_layernorm,
                    mlp=moe.mlp,
                    mlp_bda=get_bias_dropout_add,
                ),
            ),
        ),
    )


def _local_norm_hybrid_stack() -> type:
    """MCore's ``HybridStack`` with the local final norm: its constructor builds ``TENorm``
    unconditionally, which raises without Transformer Engine. Everything else (the layers, the
    forward, full recompute's ``checkpointed_forward``) is MCore's own."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.hybrid.hybrid_block import HybridStack

    class LocalNormHybridStack(HybridStack):
        def __init__(
            self,
            config: Any,
            submodules: Any,
            *args: Any,
            post_layer_norm: bool = True,
            **kwargs: Any,
        ) -> None:
            super().__init__(config, submodules, *args, post_layer_norm=False, **kwargs)
            self.post_layer_norm = post_layer_norm
            if self.post_process and post_layer_norm:
                norm = LocalSpecProvider().layer_norm(
                    rms_norm=config.normalization == "RMSNorm", for_qk=False
                )
                self.final_norm = norm(
                    config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon
                )

    return LocalNormHybridStack


def _mixer_spec(gated_delta_product: bool) -> Any:
    """The M layers' mixer with local projections: MCore's ``MambaMixer``, or its
    ``GatedDeltaProductMixer`` (the head's ``gdp_stack_spec`` puts it in the same ``MambaLayer``)."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.spec_utils import ModuleSpec

    local = LocalSpecProvider()
    projections = {
        "in_proj": local.column_parallel_linear(),
        "out_proj": local.row_parallel_linear(),
    }
    if gated_delta_product:
        gdp = importlib.import_module(_GDP_MODULE)
        return ModuleSpec(
            module=gdp.GatedDeltaProductMixer,
            submodules=gdp.GatedDeltaProductMixerSubmodules(**projections),
        )
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules

    return ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(**projections))


def build_hybrid_model(
    style: StyleModel, config: Any, attention_backend: str, seq_length: int
) -> torch.nn.Module:
    """MCore's ``HybridModel`` of ``style.hybrid_pattern`` over ``hybrid_stack_spec``; no position
    embedding, as Nemotron-H has none (its attention layers take no RoPE)."""
    from megatron.core.models.hybrid.hybrid_model import HybridModel

    return HybridModel(
        config,
        hybrid_stack_spec(config, attention_backend, style.gated_delta_product),
        vocab_size=style.vocab_size,
        max_sequence_length=seq_length,
        hybrid_layer_pattern=style.hybrid_pattern,
        position_embedding_type="none",
    )
