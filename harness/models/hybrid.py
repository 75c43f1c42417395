"""The hybrid family: Megatron Core's ``HybridModel`` over local-spec layers, with Mamba-2 mixers
(Nemotron-H / Nemotron 3 Nano style) or GatedDeltaProduct mixers (the head only)."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from megatron.core.activations import squared_relu

from harness.models.attention import core_attention_class
from harness.models.moe import grouped_gemm_experts
from harness.models.style import COMMON_KWARGS, MOE_KWARGS, StyleModel

GDP_MODULE = "megatron.core.ssm.gated_delta_product"


NEMOTRON_H_TINY = StyleModel(
    name="nemotron-h-tiny",
    description=(
        "Nemotron-H / Nemotron 3 Nano style hybrid: MCore's HybridModel with the pattern "
        "M*EME (Mamba-2 mixers, one attention layer, MoE with shared experts and "
        "squared-ReLU), no position embedding, RMSNorm; the Mamba kernels are the CPU "
        "stand-ins of harness/cpu/mamba_kernels.py"
    ),
    config_kwargs={
        **COMMON_KWARGS,
        **MOE_KWARGS,
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
)

GDP_TINY = StyleModel(
    name="gdp-tiny",
    description=(
        "GatedDeltaProduct hybrid: MCore's HybridModel with the pattern M*E whose M layer "
        "is a GatedDeltaProductMixer (2 Householder steps per token, as MCore's gdp stack "
        "spec), then attention and MoE with shared experts; its fla / causal-conv1d / "
        "mamba-ssm kernels are CPU stand-ins; a Megatron Core that has it (main) only"
    ),
    config_kwargs={
        **COMMON_KWARGS,
        **MOE_KWARGS,
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
)


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
        gdp = importlib.import_module(GDP_MODULE)
        return ModuleSpec(
            module=gdp.GatedDeltaProductMixer,
            submodules=gdp.GatedDeltaProductMixerSubmodules(**projections),
        )
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules

    return ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(**projections))


def build_hybrid_model(
    style: StyleModel, config: Any, attention_backend: str, seq_length: int
) -> torch.nn.Module:
    """MCore's ``HybridModel`` of ``style.hybrid_pattern`` over ``hybrid_stack_spec``, its MoE
    experts those of MCore's TE spec (``grouped_gemm_experts``); no position embedding, as
    Nemotron-H has none (its attention layers take no RoPE)."""
    from megatron.core.models.hybrid.hybrid_model import HybridModel

    stack_spec = hybrid_stack_spec(config, attention_backend, style.gated_delta_product)
    moe_layer = stack_spec.submodules.moe_layer.submodules
    moe_layer.mlp = grouped_gemm_experts(moe_layer.mlp, config)
    return HybridModel(
        config,
        stack_spec,
        vocab_size=style.vocab_size,
        max_sequence_length=seq_length,
        hybrid_layer_pattern=style.hybrid_pattern,
        position_embedding_type="none",
    )
