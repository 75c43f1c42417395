"""The recipe's model as Megatron Core sees it: full-width TransformerConfig values and the layer mix.

Two sources, both already used by the runner's back ends (so the estimate and a run build the same
model):

- ``bridge`` recipe ``moonlight_16b``: the DeepSeek-V3 config values of Moonlight-16B-A3B that the
  bridge back end hands to ``AutoBridge.from_hf_config`` (harness/data/bridge/moonlight-16b-a3b.json),
  mapped here to the MCore fields Bridge's DeepSeek-V3 bridge sets from them.
- ``mcore`` recipes: the named style model's TransformerConfig values with the recipe's
  ``[mcore.config]`` overrides, exactly as ``harness.run.backend_mcore`` builds them.

Everything else (Nemotron's hybrid Mamba stack: no hybrid layer model here yet, although its Mamba
layers run on CPU in the probe, harness/cpu/mamba_kernels.py) is refused with the reason. CPU-only substitutions (no TE) are the probe's: local spec, unfused bias/dropout/softmax/
rope, the ``allgather`` dispatcher (``alltoall``/``flex`` need CUDA streams), SequentialMLP experts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import torch

from harness.errors import UsageError
from harness.models import StyleModel, style_model
from harness.run.recipes import Recipe

DENSE, MOE = "dense", "moe"

# Flags the CPU layers need whatever the model: fused kernels and stream-based dispatchers are CUDA-only.
CPU_FLAGS: dict[str, Any] = {
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "moe_token_dispatcher_type": "allgather",
}


@dataclass(frozen=True)
class Architecture:
    """The model as a style model (full-width TransformerConfig values) and one kind per layer."""

    style: StyleModel
    source: str
    layer_kinds: tuple[str, ...]

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


def _style(recipe: Recipe) -> Architecture:
    style = style_model(recipe.model)
    config = {**style.config_kwargs, **recipe.backend_options.get("config", {})}
    style = replace(style, config_kwargs=config)
    freq = config.get("moe_layer_freq")
    layers = config["num_layers"]
    if "num_moe_experts" not in config:
        kinds = (DENSE,) * layers
    elif isinstance(freq, list):
        kinds = tuple(MOE if f else DENSE for f in freq)
    else:
        kinds = tuple(MOE if i % int(freq or 1) == 0 else DENSE for i in range(layers))
    return Architecture(
        style, f"style model {style.name} + recipe {recipe.name} [mcore.config]", kinds
    )


def architecture(recipe: Recipe) -> Architecture:
    """The recipe's model; a usage error for models the estimate cannot build on CPU."""
    if recipe.backend == "bridge" and recipe.backend_options.get("recipe") == "moonlight_16b":
        arch = _moonlight_16b()
    elif recipe.backend == "mcore":
        arch = _style(recipe)
    else:
        raise UsageError(
            f"recipe {recipe.name!r}: no CPU layer model for {recipe.model!r} (the estimate builds GPT "
            "layers only; Mamba layers run on CPU in the probe's nemotron-h-tiny); estimate covers "
            "Moonlight-style and mcore style-model recipes"
        )
    if len(arch.layer_kinds) != arch.config["num_layers"]:
        raise UsageError(
            f"recipe {recipe.name!r}: moe_layer_freq has {len(arch.layer_kinds)} entries "
            f"for {arch.config['num_layers']} layers"
        )
    return arch
