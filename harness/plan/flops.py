"""The cost of a row: the forward FLOPs its checkpoints replay, as a share of the step's FLOPs.

Matrix-multiply FLOPs per layer region, counted the way Megatron-LM's
``num_floating_point_operations`` (megatron/training/training.py) counts them (2 per multiply-add;
causal attention half the score and value products), plus the elementwise work of norms and
activations (a few FLOPs an element: their replay is cheap in FLOPs, and memory-bound on a GPU, which
this share does not see). A step is forward + backward (2x forward) of every layer and the logits.
A row replays, once, the forward of the union of its labels' regions.
"""

from __future__ import annotations

from typing import Any

from harness.config.fields import RecomputeFields
from harness.estimate.model import ATTENTION, DENSE, MAMBA, MLP, MOE

NORM_FLOPS_PER_ELEMENT = 4  # square, mean, rsqrt-scale, weight
ACTIVATION_FLOPS_PER_ELEMENT = 2

# Regions each label replays (nested labels: moe covers its experts, their activation and the
# shared experts).
LABEL_REGIONS = {
    "core_attn": {"core_attn"},
    "mla_up_proj": {"mla_up_proj"},
    "layernorm": {"norms"},
    "mlp": {"mlp"},
    "moe": {"router", "experts", "moe_act", "shared_experts"},
    "moe_act": {"moe_act"},
    "shared_experts": {"shared_experts"},
    "gdn_norm_out": set(),
}


def _mlp_flops(tokens: int, hidden: int, ffn: int, glu: bool) -> int:
    return 2 * tokens * hidden * ffn * (3 if glu else 2)


def layer_regions(kind: str, config: dict[str, Any], seq: int, mbs: int) -> dict[str, int]:
    """Forward FLOPs of each region of one layer of ``kind`` for one micro-batch (whole sequence)."""
    t = seq * mbs
    h = config["hidden_size"]
    glu = bool(config.get("gated_linear_unit"))
    heads = config["num_attention_heads"]
    regions: dict[str, int] = {}
    if kind in (DENSE, MOE, ATTENTION):
        if config.get("multi_latent_attention"):
            qk, rope, v = config["qk_head_dim"], config["qk_pos_emb_head_dim"], config["v_head_dim"]
            kv_rank, q_rank = config["kv_lora_rank"], config.get("q_lora_rank")
            down = 2 * t * h * (kv_rank + rope) + (2 * t * h * q_rank if q_rank else 0)
            up = 2 * t * kv_rank * heads * (qk + v) + 2 * t * (q_rank or h) * heads * (qk + rope)
            regions["attention_proj"] = down + 2 * t * heads * v * h
            regions["mla_up_proj"] = up
            regions["core_attn"] = 2 * t * seq * heads * (qk + rope + v) // 2
        else:
            d = config.get("kv_channels") or h // heads
            groups = config.get("num_query_groups") or heads
            regions["attention_proj"] = 2 * t * h * d * (heads + 2 * groups) + 2 * t * heads * d * h
            regions["core_attn"] = 2 * 2 * t * seq * heads * d // 2
        regions["norms"] = NORM_FLOPS_PER_ELEMENT * t * h * (1 if kind == ATTENTION else 2)
    if kind in (DENSE, MLP):
        ffn = config["ffn_hidden_size"]
        regions["mlp"] = _mlp_flops(t, h, ffn, glu) + ACTIVATION_FLOPS_PER_ELEMENT * t * ffn
    if kind == MOE:
        experts, topk = config["num_moe_experts"], config["moe_router_topk"]
        ffn = config.get("moe_ffn_hidden_size") or config["ffn_hidden_size"]
        regions["router"] = 2 * t * h * experts
        regions["experts"] = _mlp_flops(t * topk, h, ffn, glu)
        regions["moe_act"] = ACTIVATION_FLOPS_PER_ELEMENT * t * topk * ffn * (2 if glu else 1)
        shared = config.get("moe_shared_expert_intermediate_size") or 0
        if shared:
            regions["shared_experts"] = _mlp_flops(t, h, shared, glu)
    if kind == MAMBA:
        d_inner = config.get("mamba_num_heads", 0) * config.get("mamba_head_dim", 0) or 2 * h
        state, groups = config.get("mamba_state_dim", 128), config.get("mamba_num_groups", 8)
        nheads = config.get("mamba_num_heads") or d_inner // 64
        in_proj = 2 * t * h * (2 * d_inner + 2 * groups * state + nheads)
        regions["mamba"] = in_proj + 2 * t * d_inner * h + 2 * 3 * t * d_inner * state
    return regions


def step_flops(kinds: list[str], config: dict[str, Any], seq: int, mbs: int, vocab: int) -> int:
    """Forward + backward FLOPs of one micro-batch through the whole model (every layer, logits)."""
    forward = sum(sum(layer_regions(kind, config, seq, mbs).values()) for kind in kinds)
    forward += 2 * seq * mbs * config["hidden_size"] * vocab
    return 3 * forward


def replayed_flops(
    row: str, kinds: list[str], config: dict[str, Any], seq: int, mbs: int, pp: int
) -> int:
    """Forward FLOPs ``row`` replays in one micro-batch's backward over the whole model."""
    fields = RecomputeFields.parse(row)
    if fields.granularity == "full":
        per_stage = len(kinds) // pp
        replayed = 0
        for start in range(0, len(kinds), per_stage):
            stage = kinds[start : start + per_stage]
            chosen = stage if fields.method == "uniform" else stage[: fields.num_layers or 0]
            replayed += sum(sum(layer_regions(k, config, seq, mbs).values()) for k in chosen)
        return replayed
    regions = set().union(*(LABEL_REGIONS.get(label, set()) for label in fields.modules or ()))
    return sum(
        flops
        for kind in kinds
        for region, flops in layer_regions(kind, config, seq, mbs).items()
        if region in regions and not (region == "norms" and kind == ATTENTION)
    )


def cost_share(
    row: str, kinds: list[str], config: dict[str, Any], seq: int, mbs: int, vocab: int, pp: int
) -> float:
    """Replayed FLOPs as a share of the step's (0 for ``[]``)."""
    return replayed_flops(row, kinds, config, seq, mbs, pp) / step_flops(
        kinds, config, seq, mbs, vocab
    )
