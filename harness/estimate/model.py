"""The recipe's model as Megatron Core sees it: full-width TransformerConfig values and the layer mix.

Three sources, each the one a run of the recipe builds its model from:

- ``bridge`` recipe ``moonlight_16b``: the DeepSeek-V3 config values of Moonlight-16B-A3B that the
  bridge back end hands to ``AutoBridge.from_hf_config`` (harness/data/bridge/moonlight-16b-a3b.json),
  mapped here to the MCore fields Bridge's DeepSeek-V3 bridge sets from them.
- ``bridge`` recipe ``nemotron_3_nano``: the ``HybridModelProvider`` values of Bridge's Nemotron 3 Nano
  pretrain recipe (harness/data/bridge/nemotron-3-nano-30b-a3b.json, provenance inside), with the
  recipe's ``[bridge.model]`` overrides (the short recipes' ``num_layers`` / ``hybrid_layer_pattern``),
  as the bridge back end applies them. A hybrid model: one layer kind per symbol of MCore's hybrid
  layer pattern (``M`` Mamba, ``*`` attention, ``E`` MoE, ``-`` MLP), each a layer of MCore's hybrid
  stack (``harness.models.hybrid_stack_spec``; the Mamba mixer's kernels are the CPU adapter's
  stand-ins, harness/cpu/mamba_kernels.py).
- ``mcore`` recipes: the named style model's TransformerConfig values with the recipe's
  ``[mcore.config]`` overrides, exactly as ``harness.run.backend_mcore`` builds them (a hybrid style
  model, e.g. ``nemotron-h-tiny``, by its pattern).

Any other model is refused with the reason. CPU-only substitutions (no TE) are the probe's: local spec,
unfused bias/dropout/softmax/rope, the ``allgather`` dispatcher (``alltoall``/``flex`` need CUDA
streams), SequentialMLP experts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import torch
from megatron.core.activations import squared_relu

from harness.errors import UsageError
from harness.models import StyleModel, style_model
from harness.run.recipes import Recipe

DENSE, MOE = "dense", "moe"
# A hybrid model's layer kinds besides MOE (MoE-only layers there): Mamba-only, attention-only, MLP-only.
MAMBA, ATTENTION, MLP = "mamba", "attention", "mlp"

# Flags the CPU layers need whatever the model: fused kernels and stream-based dispatchers are CUDA-only.
CPU_FLAGS: dict[str, Any] = {
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "moe_token_dispatcher_type": "allgather",
    "moe_permute_fusion": False,
    "moe_shared_expert_overlap": False,  # a second CUDA stream; it reorders work, keeps the same bytes
}


@dataclass(frozen=True)
class Architecture:
    """The model as a style model (full-width TransformerConfig values) and one kind per layer."""

    style: StyleModel
    source: str
    layer_kinds: tuple[str, ...]
    # Grouped-GEMM experts as the GPU run builds them: TEGroupedMLP from Megatron Core's TE spec
    # (Bridge; Megatron-LM's transformer_engine implementation), the adapter's grouped-linear
    # stand-ins on CPU; False for the mcore back end, whose one measured GPU image has no TE and
    # builds SequentialMLP (docs/measured-gpu.md), as plan models that back end.
    te_grouped_experts: bool = True

    @property
    def kinds(self) -> tuple[str, ...]:
        """The distinct layer kinds, in first-appearance order."""
        return tuple(dict.fromkeys(self.layer_kinds))

    @property
    def config(self) -> dict[str, Any]:
        return self.style.config_kwargs


def _moonlight_16b() -> Architecture:
    text = (
        resources.files("harness")
        .joinpath("data", "bridge", "moonlight-16b-a3b.json")
        .read_text(encoding="utf-8")
    )
    hf = json.loads(text)
    layers = hf["num_hidden_layers"]
    dense_first = hf["first_k_dense_replace"]
    freq = [0] * dense_first + [1] * (layers - dense_first)
    config = {
        "num_layers": layers,
        "hidden_size": hf["hidden_size"],
        "num_attention_heads": hf["num_attention_heads"],
        "num_query_groups": hf["num_key_value_heads"],
        "ffn_hidden_size": hf["intermediate_size"],
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf["rms_norm_eps"],
        "gated_linear_unit": hf["hidden_act"] == "silu",
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": hf["attention_bias"],
        "attention_dropout": hf["attention_dropout"],
        "hidden_dropout": 0.0,  # DeepSeek-V3 has no hidden dropout (config.json has no such key)
        "multi_latent_attention": True,
        "q_lora_rank": hf["q_lora_rank"],
        "kv_lora_rank": hf["kv_lora_rank"],
        "qk_head_dim": hf["qk_nope_head_dim"],
        "qk_pos_emb_head_dim": hf["qk_rope_head_dim"],
        "v_head_dim": hf["v_head_dim"],
        "rope_type": "rope" if hf["rope_scaling"] is None else "yarn",
        "rotary_base": hf["rope_theta"],
        "num_moe_experts": hf["n_routed_experts"],
        "moe_router_topk": hf["num_experts_per_tok"],
        "moe_ffn_hidden_size": hf["moe_intermediate_size"],
        "moe_shared_expert_intermediate_size": hf["n_shared_experts"] * hf["moe_intermediate_size"],
        "moe_layer_freq": freq,
        "moe_grouped_gemm": True,
        "moe_router_score_function": hf["scoring_func"],
        "moe_router_enable_expert_bias": hf["topk_method"] == "noaux_tc",
        "moe_router_topk_scaling_factor": hf["routed_scaling_factor"],
        "moe_router_num_groups": hf["n_group"],
        "moe_router_group_topk": hf["topk_group"],
        "moe_router_load_balancing_type": "seq_aux_loss" if hf["seq_aux"] else "aux_loss",
        "moe_aux_loss_coeff": hf["aux_loss_alpha"],
        # Set by Bridge's DeepSeek-V3 bridge whatever the HF config says (600d069b,
        # src/megatron/bridge/models/deepseek/deepseek_v3_bridge.py), each changing a tensor a layer
        # keeps: the fused (weighted) SwiGLU keeps its input alone, where the unfused one keeps three
        # intermediates more; the router works in fp32 and softmaxes before its top-k. Left out:
        # its qk_layernorm, which the TE spec fuses into linear_kv_up_proj (the local spec cannot
        # build it without q_lora_rank): the KV norm's output, ~2 MB a layer, is not counted.
        "bias_activation_fusion": True,
        "moe_router_dtype": "fp32",
        "moe_router_pre_softmax": True,
        "attention_softmax_in_fp32": False,
    }
    style = StyleModel(
        "moonlight-16b",
        "Moonlight-16B-A3B: MLA (q_lora_rank None) + 64-expert MoE, first layer dense",
        config,
        mla=True,
    )
    return Architecture(
        style,
        "harness/data/bridge/moonlight-16b-a3b.json (Moonlight-16B-A3B config.json)",
        tuple(MOE if f else DENSE for f in freq),
    )


def _llama3_70b() -> Architecture:
    text = (
        resources.files("harness")
        .joinpath("data", "bridge", "llama3-70b.json")
        .read_text(encoding="utf-8")
    )
    hf = json.loads(text)
    config = {
        "num_layers": hf["num_hidden_layers"],
        "hidden_size": hf["hidden_size"],
        "num_attention_heads": hf["num_attention_heads"],
        "num_query_groups": hf["num_key_value_heads"],
        "ffn_hidden_size": hf["intermediate_size"],
        "kv_channels": hf["hidden_size"] // hf["num_attention_heads"],
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf["rms_norm_eps"],
        "gated_linear_unit": hf["hidden_act"] == "silu",
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": hf["attention_bias"] or hf["mlp_bias"],
        "attention_dropout": hf["attention_dropout"],
        "hidden_dropout": 0.0,  # Llama has none
    }
    style = StyleModel(
        "llama3-70b",
        "Llama3 70B: 80 dense layers, GQA (64 heads in 8 groups), SwiGLU, RMSNorm",
        config,
    )
    return Architecture(
        style,
        "harness/data/bridge/llama3-70b.json (Meta-Llama-3-70B, Megatron Bridge's values)",
        (DENSE,) * hf["num_hidden_layers"],
    )


def hybrid_layer_kinds(pattern: str, where: str) -> tuple[str, ...]:
    """One kind per symbol of MCore's hybrid layer pattern; a symbol without a CPU layer model here
    (MCore's others: Gated DeltaNet, DSA / MLA attention; ``|`` pipeline and ``/`` MTP separators)
    or unknown to MCore is a usage error."""
    from megatron.core.models.hybrid.hybrid_layer_allocation import Symbols

    kinds = {Symbols.MAMBA: MAMBA, Symbols.ATTENTION: ATTENTION, Symbols.MOE: MOE, Symbols.MLP: MLP}
    unknown = sorted(set(pattern) - set(kinds))
    if unknown:
        known = "MCore layer symbol(s)" if set(unknown) <= Symbols.VALID_LAYERS else "symbol(s)"
        raise UsageError(
            f"{where}: hybrid layer pattern {pattern!r} has {known} {' '.join(map(repr, unknown))} "
            f"the estimate has no layer model for (it builds {', '.join(map(repr, kinds))})"
        )
    return tuple(kinds[symbol] for symbol in pattern)


def _nemotron_3_nano(recipe: Recipe) -> Architecture:
    text = (
        resources.files("harness")
        .joinpath("data", "bridge", "nemotron-3-nano-30b-a3b.json")
        .read_text(encoding="utf-8")
    )
    provider = {key: value for key, value in json.loads(text).items() if not key.startswith("_")}
    provider.update(recipe.backend_options.get("model", {}))
    pattern = provider.pop("hybrid_layer_pattern")
    # The provider's, not TransformerConfig's: Nemotron-H has no position embedding (its attention
    # layers take no RoPE), and the layers the estimate builds take none either.
    provider.pop("position_embedding_type")
    config = {
        **provider,
        # MCore's own function: TEGroupedMLP takes its fused weighted path (the recipe's
        # use_fused_weighted_squared_relu) only for ``activation_func == squared_relu``
        "activation_func": squared_relu,
        "is_hybrid_model": True,
    }
    style = StyleModel(
        "nemotron-3-nano",
        "Nemotron 3 Nano 30B-A3B: hybrid Mamba-2 / attention / MoE (128 experts, shared expert, "
        "squared ReLU)",
        config,
        hybrid_pattern=pattern,
    )
    return Architecture(
        style,
        "harness/data/bridge/nemotron-3-nano-30b-a3b.json (Megatron Bridge 600d069b "
        "nemotron_3_nano_pretrain_config)"
        + (" + recipe [bridge.model]" if "model" in recipe.backend_options else ""),
        hybrid_layer_kinds(pattern, f"recipe {recipe.name!r}"),
    )


def _style(recipe: Recipe) -> Architecture:
    style = style_model(recipe.model)
    config = {**style.config_kwargs, **recipe.backend_options.get("config", {})}
    style = replace(style, config_kwargs=config)
    freq = config.get("moe_layer_freq")
    layers = config["num_layers"]
    if style.hybrid_pattern:
        kinds = hybrid_layer_kinds(style.hybrid_pattern, f"recipe {recipe.name!r}")
    elif "num_moe_experts" not in config:
        kinds = (DENSE,) * layers
    elif isinstance(freq, list):
        kinds = tuple(MOE if f else DENSE for f in freq)
    else:
        kinds = tuple(MOE if i % int(freq or 1) == 0 else DENSE for i in range(layers))
    return Architecture(
        style,
        f"style model {style.name} + recipe {recipe.name} [mcore.config]",
        kinds,
        te_grouped_experts=False,
    )


def architecture(recipe: Recipe) -> Architecture:
    """The recipe's model; a usage error for models the estimate cannot build on CPU."""
    bridge_recipe = recipe.backend_options.get("recipe") if recipe.backend == "bridge" else None
    if bridge_recipe == "moonlight_16b":
        arch = _moonlight_16b()
    elif bridge_recipe == "nemotron_3_nano":
        arch = _nemotron_3_nano(recipe)
    elif bridge_recipe == "llama3_70b_sft_fp8cs":
        arch = _llama3_70b()
    elif recipe.backend == "mcore":
        arch = _style(recipe)
    else:
        raise UsageError(
            f"recipe {recipe.name!r}: no CPU layer model for {recipe.model!r}; estimate covers "
            "Moonlight 16B, Nemotron 3 Nano and Llama3 70B bridge recipes and mcore style-model "
            "recipes"
        )
    if len(arch.layer_kinds) != arch.config["num_layers"]:
        counted = (
            f"hybrid layer pattern {arch.style.hybrid_pattern!r} has"
            if arch.style.hybrid_pattern
            else "moe_layer_freq has"
        )
        raise UsageError(
            f"recipe {recipe.name!r}: {counted} {len(arch.layer_kinds)} entries "
            f"for {arch.config['num_layers']} layers"
        )
    return arch
