"""The MoE families of the GPU recipes on a GPT decoder: Moonlight/DeepSeek-V3 (Multi-Latent Attention,
allgather dispatcher) and the attention + MoE part of Nemotron-H (alltoall dispatcher); and the
process-global MoE metrics tracker their routers record into."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from typing import Any

import torch
from megatron.core.activations import squared_relu

from harness.models.style import COMMON_KWARGS, MOE_KWARGS, StyleModel

MOONLIGHT_TINY = StyleModel(
    name="moonlight-tiny",
    description=(
        "Moonlight/DeepSeek-V3 style: Multi-Latent Attention (q_lora_rank None; no "
        "latent KV norm: 0.19.2 cannot build it from the local spec) + MoE with shared "
        "experts and the grouped-GEMM flag, first layer dense (moe_layer_freq "
        "[0,1,1]), RMSNorm, SwiGLU, 3 layers"
    ),
    config_kwargs={
        **COMMON_KWARGS,
        **MOE_KWARGS,
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
)

NEMOTRON_TINY = StyleModel(
    name="nemotron-tiny",
    description=(
        "attention + MoE (shared experts, squared-ReLU, grouped-GEMM flag) part of "
        "the Nemotron-H pattern, 2 layers, on the alltoall token dispatcher (the CPU "
        "relative of the recipe's HybridEP / flex); the Mamba layers are left out here "
        "(nemotron-h-tiny has them, on the CPU stand-ins of their CUDA kernels)"
    ),
    config_kwargs={
        **COMMON_KWARGS,
        **MOE_KWARGS,
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
)


def fit_moe_metrics_tracker(num_layers: int) -> None:
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


def _moe_submodules(mlp_spec: Any) -> Any:
    """The ``MoESubmodules`` of a MoE layer's MLP spec (a ``partial`` of ``MoELayer`` or a
    ``ModuleSpec`` of it), or None for any other MLP spec."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    if isinstance(mlp_spec, functools.partial) and mlp_spec.func is MoELayer:
        return mlp_spec.keywords.get("submodules")
    if getattr(mlp_spec, "module", None) is MoELayer:
        return mlp_spec.submodules
    return None


def grouped_gemm_experts(mlp_spec: Any, config: Any) -> Any:
    """A MoE layer's MLP spec whose experts are what Megatron Core's Transformer Engine spec builds
    for ``moe_grouped_gemm`` (``TESpecProvider.grouped_mlp_modules``: ``TEGroupedMLP`` over TE's
    grouped linears, the CPU adapter's stand-ins where TE is absent), as the GPU recipes run; the
    local spec builds ``SequentialMLP`` there, where ``moe_act`` does nothing. Any other spec, a
    config without grouped GEMM, or a tree whose TE spec has no grouped linear, is returned as it is.
    """
    from megatron.core.extensions import transformer_engine_spec_provider as te_spec

    submodules = _moe_submodules(mlp_spec)
    if (
        submodules is None
        or not config.moe_grouped_gemm
        or te_spec.TEColumnParallelGroupedLinear is None
    ):
        return mlp_spec
    grouped = dataclasses.replace(
        submodules, experts=te_spec.TESpecProvider().grouped_mlp_modules(True)
    )
    if isinstance(mlp_spec, functools.partial):
        return functools.partial(
            mlp_spec.func, *mlp_spec.args, **{**mlp_spec.keywords, "submodules": grouped}
        )
    spec = copy.copy(mlp_spec)
    spec.submodules = grouped
    return spec
