"""What a style model is: ``StyleModel``, and the TransformerConfig keyword arguments the families share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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


COMMON_KWARGS: dict[str, Any] = {
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


DENSE_KWARGS: dict[str, Any] = {
    "ffn_hidden_size": 128,
    "num_query_groups": 2,
    "gated_linear_unit": True,
    "activation_func": torch.nn.functional.silu,
}


MOE_KWARGS: dict[str, Any] = {
    "num_moe_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "moe_token_dispatcher_type": "allgather",
    "moe_router_load_balancing_type": "aux_loss",
    "moe_aux_loss_coeff": 1e-2,
}
