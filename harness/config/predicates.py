"""The named predicates of the rule table (``harness.config.rules``): the conditions several rules share
or that need more than one line."""

from __future__ import annotations

from harness.config.view import ConfigView


def graphs_on(c: ConfigView) -> bool:
    return c.cuda_graph_impl != "none"


def per_layer_graphs(c: ConfigView) -> bool:
    return c.cuda_graph_impl in ("local", "transformer_engine")


def graphed_selective(c: ConfigView) -> bool:
    return graphs_on(c) and c.granularity == "selective"


def ep_overlap(c: ConfigView) -> bool:
    return bool(c["overlap_moe_expert_parallel_comm"])


def fp8_output_discard(c: ConfigView) -> bool:
    return bool(c["fp8"]) and (c.selective("moe_act") or c.selective("layernorm"))


# Offload modules inside the MoE forward: a whole-``moe`` checkpoint and local partial-MoE graphs
# both reason about them (MCore's own set, in two checks).
MOE_INTERNAL_OFFLOADS = frozenset({"expert_fc1", "moe_act", "fused_group_mlp"})


def fine_grained_offloading(c: ConfigView) -> bool:
    return bool(c.optional("fine_grained_activation_offloading"))


def offload_modules(c: ConfigView) -> frozenset[str]:
    return frozenset(c.optional("offload_modules") or ())


def graphs_fit_fine_grained_offloading(c: ConfigView) -> bool:
    """TE or full-iteration graphs, or local graphs that offload only inside an uncaptured MoE."""
    if c.cuda_graph_impl in ("transformer_engine", "full_iteration"):
        return True
    offloads = offload_modules(c)
    return (
        c.cuda_graph_impl == "local"
        and bool(offloads)
        and offloads <= MOE_INTERNAL_OFFLOADS
        and "moe" not in c.cuda_graph_modules
    )


def negative_or_unset(value: int | None) -> bool:
    return value is None or value < 0


def all_moe_layers(c: ConfigView) -> bool:
    freq = c["moe_layer_freq"]
    return freq == 1 or (isinstance(freq, list) and 0 not in freq)
