"""The published activation-memory formulas the estimate is checked against, and their GPT layer.

- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2 /
  eq. (1): one GPT layer at 16-bit with dropout keeps ``s·b·h·(34 + 5·a·s/h)`` bytes; with selective
  (attention-core) recompute ``34·s·b·h``; both divided by ``t`` under tensor + sequence parallel.
  The 34: attention 11 (QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1), MLP 19
  (fc1 input 2, GELU input 8, fc2 input 8, dropout mask 1), two LayerNorm inputs 4. The 5·a·s/h:
  softmax output 2, attention-dropout mask 1, dropout output 2 (per element of ``b·a·s²``).
- Megatron-LM ``megatron/training/theoretical_memory_usage.py``: with SP and selective recompute
  ``s·b·h·(18 + 4·ffn/h) / t`` per layer (= 34 at ffn = 4h), without SP ``s·b·h·(10 + 24/t)``; no
  score term in either (it assumes the attention core is recomputed or fused).

``GPT_ANCHOR`` is that layer built from MCore's local spec: LayerNorm, biases, GELU MLP of 4h,
standard multi-head attention without rotary embeddings (the paper's GPT has learned absolute
positions, outside the layer), hidden and attention dropout.
"""

from __future__ import annotations

import torch

from harness.models import StyleModel

GPT_ANCHOR = StyleModel(
    name="gpt-anchor",
    description="Korthikanti et al.'s GPT layer: LayerNorm, biases, GELU MLP 4h, MHA without rope, dropout",
    config_kwargs={
        "num_layers": 1,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "ffn_hidden_size": 1024,
        "normalization": "LayerNorm",
        "add_bias_linear": True,
        "gated_linear_unit": False,
        "activation_func": torch.nn.functional.gelu,
        "bias_activation_fusion": False,
    },
)


def korthikanti_layer_bytes(
    s: int, b: int, h: int, a: int, *, selective: bool = False, t: int = 1
) -> float:
    """Per-layer activation bytes of Korthikanti et al. (16-bit, dropout; TP + SP over ``t``)."""
    per_sbh = 34 + (0 if selective else 5 * a * s / h)
    return s * b * h * per_sbh / t


def megatron_lm_layer_bytes(
    s: int, b: int, h: int, ffn: int, *, t: int = 1, sequence_parallel: bool = True
) -> float:
    """Per-layer activation bytes of Megatron-LM's theoretical_memory_usage.py (selective recompute)."""
    if sequence_parallel:
        return s * b * h * (18 + 4 * ffn / h) / t
    return s * b * h * (10 + 24 / t)
