"""The recompute compatibility matrix, as data.

One ``Rule`` (``harness.config.rule``) per constraint. Rules the TransformerConfig validator enforces carry a ``predicate``
(when it fires, over a ``ConfigView``) and a ``message`` pattern (how to recognize MCore's own
message); they are listed in the order ``__post_init__`` checks them, because the first rule that
fires is the one MCore reports; a rule with a ``rewrite`` mirrors a field ``__post_init__`` changes
on the way, which the rules after it see. Rules enforced elsewhere (layer build, runtime, Bridge)
and the validator's silent acceptances are documented here too, and are tested by the unit tests
(tests/unit/config/test_rules.py) instead of the differential check.

Rule ids are stable: goldens, reports and ``validate --json`` name rules by id.

The table alone lives here; the predicates it names are ``harness.config.predicates``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from harness.config.predicates import (
    MOE_INTERNAL_OFFLOADS,
    all_moe_layers,
    ep_overlap,
    fine_grained_offloading,
    fp8_output_discard,
    graphed_selective,
    graphs_fit_fine_grained_offloading,
    graphs_on,
    negative_or_unset,
    offload_modules,
    per_layer_graphs,
)
from harness.config.rule import (
    BRIDGE,
    LAYER_BUILD,
    MCORE_CONFIG,
    MCORE_LAYER,
    MCORE_PARALLEL,
    MCORE_RECOMPUTE,
    RUNTIME,
    SKILL,
    TE_MIN_FOR_FP8_OUTPUT_DISCARD,
    TE_MIN_FOR_MOE_FP8,
    UNCLASSIFIED,
    VALIDATOR,
    Rule,
)

RULES: tuple[Rule, ...] = (
    # --- prerequisites the generated configurations can reach (parallelism, MoE) -------------------
    Rule(
        "parallel.sequence-parallel-needs-tp",
        ("sequence_parallel", "tensor_model_parallel_size"),
        "sequence_parallel with TP=1",
        "reject",
        VALIDATOR,
        MCORE_PARALLEL,
        lambda c: c["sequence_parallel"] and c["tensor_model_parallel_size"] <= 1,
        r"Cannot use sequence parallelism without tensor parallelism",
        "ValueError",
    ),
    Rule(
        "parallel.pipeline-needs-dtype",
        ("pipeline_model_parallel_size", "pipeline_dtype"),
        "PP>1 without pipeline_dtype",
        "reject",
        VALIDATOR,
        MCORE_PARALLEL,
        lambda c: c["pipeline_model_parallel_size"] > 1 and c["pipeline_dtype"] is None,
        r"pipeline_dtype must be specified",
        "ValueError",
    ),
    Rule(
        "precision.fp4-vs-fp8",
        ("fp4", "fp8"),
        "FP4 and FP8 both set",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: bool(c.optional("fp4")) and bool(c["fp8"]),
        r"fp4 and fp8 cannot be used simultaneously",
        "ValueError",
    ),
    Rule(
        "moe.expert-parallel-needs-experts",
        ("expert_model_parallel_size", "num_moe_experts"),
        "EP>1 on a model without experts",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c["expert_model_parallel_size"] > 1 and c["num_moe_experts"] is None,
        r"num_moe_experts must be non None to use expert-parallel",
        "ValueError",
    ),
    Rule(
        "moe.shared-expert-overlap-needs-alltoall",
        (
            "moe_shared_expert_intermediate_size",
            "moe_shared_expert_overlap",
            "moe_token_dispatcher_type",
        ),
        "shared-expert overlap with a dispatcher other than alltoall/flex",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            c["moe_shared_expert_intermediate_size"] is not None
            and c["moe_shared_expert_overlap"]
            and c["moe_token_dispatcher_type"] not in ("alltoall", "flex")
        ),
        r"moe_shared_expert_overlap only works with alltoall or flex",
        "ValueError",
    ),
    # --- CPU offloading (the skill: an alternative to recompute, never combined with it) ----------
    Rule(
        "offload.layers-in-range",
        ("cpu_offloading", "cpu_offloading_num_layers", "num_layers"),
        "cpu_offloading_num_layers outside [0, num_layers)",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c["cpu_offloading"] and not 0 <= c["cpu_offloading_num_layers"] < c["num_layers"],
        r"CPU offloading can be done only for layers less than",
        "ValueError",
    ),
    Rule(
        "offload.no-pipeline-parallel",
        ("cpu_offloading", "pipeline_model_parallel_size"),
        "cpu_offloading with PP>1",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: c["cpu_offloading"] and c["pipeline_model_parallel_size"] > 1,
        r"no support for Pipeline parallelism with CPU offloading",
        "ValueError",
    ),
    Rule(
        "offload.no-recompute",
        ("cpu_offloading", "recompute_granularity"),
        "cpu_offloading with any recompute granularity",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: c["cpu_offloading"] and c.granularity is not None,
        r"CPU offloading does not work when activation recomputation is enabled",
        "ValueError",
    ),
    # --- granularity, method, num_layers -----------------------------------------------------------
    Rule(
        "recompute.granularity-value",
        ("recompute_granularity",),
        "granularity not in {full, selective, None}",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c.granularity is not None and c.granularity not in ("full", "selective"),
        r"When using recompute_granuarlity: .* must be \"full\"",
        "ValueError",
    ),
    Rule(
        "recompute.method-value",
        ("recompute_granularity", "recompute_method"),
        "recompute enabled and method not in {uniform, block, None}",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            c.granularity is not None and c["recompute_method"] not in (None, "block", "uniform")
        ),
        r"recompute_method: .* must be \"block\" or \"uniform\"\.",
        "ValueError",
    ),
    Rule(
        "recompute.full-needs-method",
        ("recompute_granularity", "recompute_method"),
        "full granularity without recompute_method",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: c.granularity == "full" and c["recompute_method"] is None,
        r"so recompute_method must be \"block\" or \"uniform\"",
        "ValueError",
    ),
    Rule(
        "recompute.full-needs-num-layers",
        ("recompute_granularity", "recompute_num_layers"),
        "full granularity without recompute_num_layers",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: c.granularity == "full" and c["recompute_num_layers"] is None,
        r"recompute_num_layers must be between 1 and num_layers_per_pipeline_rank",
        "ValueError",
    ),
    Rule(
        "recompute.selective-forbids-num-layers",
        ("recompute_granularity", "recompute_num_layers"),
        "selective granularity with recompute_num_layers set",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c.granularity == "selective" and c["recompute_num_layers"] is not None,
        r"When using recompute_granularity: selective recompute_num_layers must be None",
        "ValueError",
    ),
    Rule(
        "recompute.distribute-saved-activations-vs-sequence-parallel",
        ("recompute_granularity", "distribute_saved_activations", "sequence_parallel"),
        "recompute on, distribute_saved_activations and sequence_parallel",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: (
            c.granularity is not None
            and c["distribute_saved_activations"]
            and c["sequence_parallel"]
        ),
        r"distribute_saved_activations: .* must be false when sequence parallel",
        "ValueError",
    ),
    # --- labels ------------------------------------------------------------------------------------
    Rule(
        "labels.unknown",
        ("recompute_granularity", "recompute_modules"),
        "selective with a label outside the validator's accepted set",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: c.granularity == "selective" and bool(set(c.modules) - c.accepted_labels),
        r"Invalid choices for recompute_modules",
        "AssertionError",
    ),
    Rule(
        "labels.moe_act-needs-grouped-gemm",
        ("recompute_modules", "moe_grouped_gemm"),
        "selective moe_act without grouped-GEMM experts",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: c.selective("moe_act") and not c["moe_grouped_gemm"],
        r"moe_act in recompute_modules is only supported with moe_grouped_gemm",
        "ValueError",
    ),
    Rule(
        "labels.mla_up_proj-needs-mla",
        ("recompute_modules", "multi_latent_attention"),
        "selective mla_up_proj without multi-latent attention",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: c.selective("mla_up_proj") and not c["multi_latent_attention"],
        r"mla_up_proj in recompute_modules is only supported with",
        "ValueError",
    ),
    Rule(
        "labels.gdn_norm_out-needs-gdn",
        ("recompute_modules", "experimental_attention_variant"),
        "selective gdn_norm_out without gated_delta_net attention",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: (
            c.selective("gdn_norm_out") and c["experimental_attention_variant"] != "gated_delta_net"
        ),
        r"gdn_norm_out in recompute_modules is only supported with",
        "ValueError",
    ),
    Rule(
        "labels.core_attn-fused-attention-warning",
        ("recompute_modules",),
        "selective core_attn (TE fused attention already rematerializes)",
        "warn",
        VALIDATOR,
        SKILL,
        lambda c: c.selective("core_attn"),
        r"you have no need to set 'core_attn' to recompute",
    ),
    Rule(
        "labels.shared_experts-vs-shared-expert-overlap",
        ("recompute_modules", "moe_shared_expert_intermediate_size", "moe_shared_expert_overlap"),
        "selective shared_experts on a model with shared experts and shared-expert overlap",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: (
            c.selective("shared_experts")
            and c["moe_shared_expert_intermediate_size"] is not None
            and c["moe_shared_expert_overlap"]
        ),
        r"shared_experts recompute cannot work with --moe-shared-expert-overlap",
        "ValueError",
    ),
    Rule(
        "fp8.delayed-scaling-vs-output-discard",
        ("recompute_modules", "fp8", "fp8_recipe"),
        "selective moe_act or layernorm under FP8 delayed scaling",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: fp8_output_discard(c) and c["fp8_recipe"] == "delayed",
        r"Delayed scaling does not support moe_act and layernorm recompute",
        "ValueError",
    ),
    Rule(
        "fp8.output-discard-needs-te",
        ("recompute_modules", "fp8", "fp8_recipe", "transformer_engine"),
        f"selective moe_act or layernorm under FP8 with Transformer Engine < {TE_MIN_FOR_FP8_OUTPUT_DISCARD}",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: fp8_output_discard(c) and not c.te_at_least(TE_MIN_FOR_FP8_OUTPUT_DISCARD),
        r"moe_act and layernorm recompute for fp8 needs transformer-engine",
        "ValueError",
    ),
    # --- the deprecated moe_layer_recompute flag: becomes selective + moe after the label checks ---
    Rule(
        "legacy.moe-layer-recompute-deprecated",
        ("moe_layer_recompute",),
        "moe_layer_recompute set",
        "warn",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c["moe_layer_recompute"],
        r"--moe-layer-recompute is deprecated",
    ),
    Rule(
        "legacy.moe-layer-recompute-vs-full",
        ("moe_layer_recompute", "recompute_granularity"),
        "moe_layer_recompute with full granularity",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c["moe_layer_recompute"] and c.granularity == "full",
        r"Do not set --moe-layer-recompute with full recompute granularity",
        "ValueError",
    ),
    Rule(
        "legacy.moe-layer-recompute-becomes-selective-moe",
        ("moe_layer_recompute", "recompute_granularity", "recompute_modules"),
        "moe_layer_recompute: granularity becomes selective and 'moe' is appended, after the label checks "
        "ran (so labels given with granularity None are never validated)",
        "silently-ignored",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c["moe_layer_recompute"],
        rewrite=lambda c: {
            "recompute_granularity": "selective",
            "recompute_modules": c.modules + ([] if "moe" in c.modules else ["moe"]),
        },
    ),
    # --- fine-grained activation offloading (reached by the space derived from the validator) --------
    Rule(
        "offload.fine-grained-vs-cpu-offloading",
        ("fine_grained_activation_offloading", "cpu_offloading"),
        "fine-grained activation offloading with cpu_offloading",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: fine_grained_offloading(c) and c["cpu_offloading"],
        r"fine_grained_activation_offloading cannot be enabled with cpu_offloading",
        "AssertionError",
    ),
    Rule(
        "offload.fine-grained-vs-moe-recompute",
        (
            "fine_grained_activation_offloading",
            "offload_modules",
            "recompute_granularity",
            "recompute_modules",
        ),
        "selective moe while offloading inside the MoE (expert_fc1, moe_act, fused_group_mlp): "
        "the checkpoint already drops those activations",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            fine_grained_offloading(c)
            and c.selective("moe")
            and bool(offload_modules(c) & MOE_INTERNAL_OFFLOADS)
        ),
        r"Cannot offload .* while recomputing the entire MoE layer",
        "AssertionError",
    ),
    Rule(
        "offload.fused-group-mlp-needs-te-op-fuser",
        (
            "fine_grained_activation_offloading",
            "offload_modules",
            "use_transformer_engine_op_fuser",
        ),
        "offloading fused_group_mlp without Transformer Engine's op fuser",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            fine_grained_offloading(c)
            and "fused_group_mlp" in offload_modules(c)
            and not c.optional("use_transformer_engine_op_fuser")
        ),
        r"fused_group_mlp requires use_transformer_engine_op_fuser",
        "ValueError",
    ),
    Rule(
        "moe.fp8-needs-te",
        ("num_moe_experts", "fp8", "transformer_engine"),
        f"MoE under FP8 with Transformer Engine < {TE_MIN_FOR_MOE_FP8}",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            bool(c["num_moe_experts"]) and bool(c["fp8"]) and not c.te_at_least(TE_MIN_FOR_MOE_FP8)
        ),
        r"Only transformer-engine>=\S+ supports MoE FP8 training",
        "ValueError",
    ),
    # --- CUDA graphs -------------------------------------------------------------------------------
    Rule(
        "cuda-graph.full-iteration-needs-empty-scope",
        ("cuda_graph_impl", "cuda_graph_modules"),
        "full_iteration capture with a per-layer scope",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c.cuda_graph_impl == "full_iteration" and bool(c.cuda_graph_modules),
        r"cuda_graph_modules must be empty when cuda_graph_impl=\"full_iteration\"",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.no-cpu-offloading",
        ("cuda_graph_impl", "cpu_offloading"),
        "per-layer CUDA graphs with cpu_offloading",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: c.cuda_graph_impl not in ("none", "full_iteration") and c["cpu_offloading"],
        r"CUDA graphs not supported with CPU offloading",
        "ValueError",
    ),
    Rule(
        "cuda-graph.moe-and-router-scopes",
        ("cuda_graph_impl", "cuda_graph_modules"),
        "per-layer scope with both moe and moe_router",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: per_layer_graphs(c) and {"moe", "moe_router"} <= c.cuda_graph_modules,
        r"cuda_graph_modules must not contain both moe and moe_router",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.moe-scope-needs-moe",
        ("cuda_graph_impl", "cuda_graph_modules", "num_moe_experts"),
        "per-layer moe/moe_router scope on a dense model",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            per_layer_graphs(c)
            and not c.is_moe
            and bool({"moe", "moe_router"} & c.cuda_graph_modules)
        ),
        r"moe cuda graph is only supported for MoE",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.mlp-scope-needs-dense-layer",
        ("cuda_graph_impl", "cuda_graph_modules", "num_moe_experts", "moe_layer_freq"),
        "per-layer mlp scope on a model whose layers are all MoE",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            per_layer_graphs(c) and c.is_moe and all_moe_layers(c) and "mlp" in c.cuda_graph_modules
        ),
        r"mlp cuda graph is only supported for dense layers",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.moe-scope-needs-drop-padding",
        (
            "cuda_graph_impl",
            "cuda_graph_modules",
            "moe_expert_capacity_factor",
            "moe_pad_expert_input_to_capacity",
        ),
        "per-layer moe scope on dropless MoE",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            per_layer_graphs(c)
            and c.is_moe
            and "moe" in c.cuda_graph_modules
            and (
                c["moe_expert_capacity_factor"] is None or not c["moe_pad_expert_input_to_capacity"]
            )
        ),
        r"moe cuda graph is only supported with drop-padding MoE",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.full-recompute-needs-full-iteration",
        ("cuda_graph_impl", "recompute_granularity"),
        "full recompute with CUDA graphs other than full_iteration",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: (
            graphs_on(c) and c.granularity == "full" and c.cuda_graph_impl != "full_iteration"
        ),
        r"full recompute is only supported with full iteration CUDA graph",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.moe-recompute-straddles-router-graph",
        ("cuda_graph_impl", "cuda_graph_modules", "recompute_modules"),
        "selective moe with transformer_engine graphs of moe_router (checkpoint straddles the graph)",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: (
            c.cuda_graph_impl == "transformer_engine"
            and c.selective("moe")
            and "moe_router" in c.cuda_graph_modules
        ),
        r"moe recompute is not supported with moe_router CUDA graph",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.graphed-attention-recompute-vs-dropout",
        ("cuda_graph_impl", "cuda_graph_modules", "recompute_modules", "attention_dropout"),
        "selective core_attn inside a graphed attention with attention_dropout != 0",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            graphed_selective(c)
            and c["attention_dropout"] != 0.0
            and c.graphed("attn")
            and "core_attn" in c.modules
        ),
        r"attention dropout is not supported with graphed attention recomputation",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.graphed-mlp-recompute-vs-dropout",
        ("cuda_graph_impl", "cuda_graph_modules", "recompute_modules", "hidden_dropout"),
        "selective mlp/moe inside a graphed MLP/MoE with hidden_dropout != 0",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            graphed_selective(c)
            and c["hidden_dropout"] != 0.0
            and (
                (c.graphed("mlp") and "mlp" in c.modules)
                or (c.graphed("moe") and "moe" in c.modules)
            )
        ),
        r"hidden dropout is not supported with graphed MLP/MoE recomputation",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.graphed-moe-recompute-vs-input-jitter",
        ("cuda_graph_impl", "cuda_graph_modules", "recompute_modules", "moe_input_jitter_eps"),
        "selective moe inside a graphed MoE with moe_input_jitter_eps set",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            graphed_selective(c)
            and c["moe_input_jitter_eps"] is not None
            and c.graphed("moe")
            and "moe" in c.modules
        ),
        r"moe_input_jitter_eps is not supported with graphed moe recomputation",
        "AssertionError",
    ),
    Rule(
        "cuda-graph.gtp-shared-experts-recompute-under-low-precision",
        (
            "gtp_weight_remat_size",
            "cuda_graph_impl",
            "cuda_graph_modules",
            "fp8",
            "fp4",
            "moe_shared_expert_intermediate_size",
            "moe_shared_expert_overlap",
            "recompute_modules",
        ),
        "selective shared_experts captured by local MoE / router graphs under FP8 or FP4 with GTP "
        "weight rematerialisation (te_checkpoint needs .backward(), the graph warmup uses .grad())",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            graphed_selective(c)
            and (c.optional("gtp_weight_remat_size") or 1) > 1
            and c.cuda_graph_impl == "local"
            and bool(c["fp8"] or c.optional("fp4"))
            and c["moe_shared_expert_intermediate_size"] is not None
            and not c["moe_shared_expert_overlap"]
            and (c.graphed("moe") or c.graphed("moe_router"))
            and "shared_experts" in c.modules
        ),
        r"GTP \+ local CUDA graphs that capture shared_experts",
        "AssertionError",
    ),
    Rule(
        "offload.fine-grained-local-graphs-vs-whole-layer",
        ("fine_grained_activation_offloading", "cuda_graph_impl", "cuda_graph_modules"),
        "fine-grained activation offloading under whole-layer local CUDA graphs",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            fine_grained_offloading(c)
            and c.cuda_graph_impl == "local"
            and offload_modules(c) <= MOE_INTERNAL_OFFLOADS
            and not c.cuda_graph_modules
        ),
        r"fine-grained activation offloading with cuda_graph_impl='local' is not supported with "
        r"whole-layer CUDA graph capture",
        "AssertionError",
    ),
    Rule(
        "offload.fine-grained-graphs-need-te-or-partial-moe",
        (
            "fine_grained_activation_offloading",
            "offload_modules",
            "cuda_graph_impl",
            "cuda_graph_modules",
        ),
        "fine-grained activation offloading under local CUDA graphs that capture the MoE",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            fine_grained_offloading(c)
            and graphs_on(c)
            and not graphs_fit_fine_grained_offloading(c)
        ),
        r"fine-grained activation offloading is only supported with transformer_engine CUDA graph",
        "AssertionError",
    ),
    Rule(
        "offload.fine-grained-vs-graphed-moe",
        ("fine_grained_activation_offloading", "cuda_graph_impl", "cuda_graph_modules"),
        "fine-grained activation offloading with the MoE scope captured (token-drop MoE)",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: fine_grained_offloading(c) and graphs_on(c) and "moe" in c.cuda_graph_modules,
        r"Token-drop MoE is temporarily not supported with activation offloading",
        "AssertionError",
    ),
    Rule(
        "offload.fine-grained-full-iteration-needs-inflight-bound",
        (
            "fine_grained_activation_offloading",
            "cuda_graph_impl",
            "fine_grained_offloading_max_inflight_offloads",
        ),
        "fine-grained activation offloading under full-iteration graphs without a bound on "
        "in-flight offloads",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            fine_grained_offloading(c)
            and c.cuda_graph_impl == "full_iteration"
            and negative_or_unset(c.optional("fine_grained_offloading_max_inflight_offloads"))
        ),
        r"fine_grained_offloading_max_inflight_offloads must be a non-negative integer",
        "AssertionError",
    ),
    # --- expert-parallel all-to-all overlap --------------------------------------------------------
    Rule(
        "ep-overlap.pipeline-needs-vpp",
        (
            "overlap_moe_expert_parallel_comm",
            "pipeline_model_parallel_size",
            "virtual_pipeline_model_parallel_size",
        ),
        "EP overlap with PP>1 and no virtual pipeline",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            ep_overlap(c)
            and c["pipeline_model_parallel_size"] > 1
            and c["virtual_pipeline_model_parallel_size"] is None
        ),
        r"virtual_pipeline_model_parallel_size must be specified",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.needs-expert-parallel",
        ("overlap_moe_expert_parallel_comm", "expert_model_parallel_size"),
        "EP overlap with EP=1",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: ep_overlap(c) and c["expert_model_parallel_size"] <= 1,
        r"overlap_moe_expert_parallel_comm is only supported with expert model parallelism",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.needs-alltoall",
        ("overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type"),
        "EP overlap with a dispatcher other than alltoall/flex",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: ep_overlap(c) and c["moe_token_dispatcher_type"] not in ("alltoall", "flex"),
        r"overlap_moe_expert_parallel_comm is supported with alltoall/flex",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.no-full-recompute",
        ("overlap_moe_expert_parallel_comm", "recompute_granularity"),
        "EP overlap with full recompute",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: ep_overlap(c) and c.granularity == "full",
        r"disable full recomputation when enabling overlap_moe_expert_parallel_comm",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.no-recompute-method",
        ("overlap_moe_expert_parallel_comm", "recompute_method"),
        "EP overlap with recompute_method set (even under selective, where it is otherwise ignored)",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: ep_overlap(c) and c["recompute_method"] is not None,
        r"disable recomputation method when enabling overlap_moe_expert_parallel_comm",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.no-recompute-num-layers",
        ("overlap_moe_expert_parallel_comm", "recompute_num_layers"),
        "EP overlap with recompute_num_layers set",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: ep_overlap(c) and c["recompute_num_layers"] is not None,
        r"recompute_num_layers must be None when enabling overlap_moe_expert_parallel_comm",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.no-moe-recompute",
        ("overlap_moe_expert_parallel_comm", "recompute_modules"),
        "EP overlap with 'moe' in recompute_modules (checked whatever the granularity)",
        "reject",
        VALIDATOR,
        SKILL,
        lambda c: ep_overlap(c) and "moe" in c.modules,
        r"disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.needs-bf16-or-fp16",
        ("overlap_moe_expert_parallel_comm", "bf16", "fp16"),
        "EP overlap in fp32",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: ep_overlap(c) and not (c["bf16"] or c["fp16"]),
        r"overlap_moe_expert_parallel_comm is only supported with bf16 or fp16",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.no-shared-expert-overlap",
        ("overlap_moe_expert_parallel_comm", "moe_shared_expert_overlap"),
        "EP overlap with shared-expert overlap",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: ep_overlap(c) and c["moe_shared_expert_overlap"],
        r"disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm",
        "AssertionError",
    ),
    Rule(
        "ep-overlap.te-graph-scope",
        ("overlap_moe_expert_parallel_comm", "cuda_graph_impl", "cuda_graph_modules"),
        "EP overlap with transformer_engine graphs of moe/mlp",
        "reject",
        VALIDATOR,
        MCORE_CONFIG,
        lambda c: (
            ep_overlap(c)
            and c.cuda_graph_impl == "transformer_engine"
            and bool({"moe", "mlp"} & c.cuda_graph_modules)
        ),
        r"CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm",
        "AssertionError",
    ),
    # --- what the validator accepts without comment (checked by tests/unit/config/test_rules.py) --
    Rule(
        "semantics.selective-empty-is-control",
        ("recompute_granularity", "recompute_modules"),
        "selective with []: accepted, nothing is recomputed",
        "accept",
        VALIDATOR,
        SKILL,
    ),
    Rule(
        "semantics.selective-default-core_attn",
        ("recompute_granularity", "recompute_modules"),
        "recompute_modules unset: becomes ['core_attn'] (whatever the granularity)",
        "accept",
        VALIDATOR,
        MCORE_CONFIG,
    ),
    Rule(
        "semantics.full-supersedes-selective",
        ("recompute_granularity", "recompute_modules"),
        "full with labels: labels kept by the validator, no per-module switch turned on",
        "silently-ignored",
        LAYER_BUILD,
        SKILL,
    ),
    Rule(
        "semantics.selective-ignores-method",
        ("recompute_granularity", "recompute_method"),
        "selective with recompute_method: accepted, the method has no effect",
        "silently-ignored",
        VALIDATOR,
        MCORE_CONFIG,
    ),
    Rule(
        "semantics.num-layers-without-granularity",
        ("recompute_granularity", "recompute_num_layers"),
        "recompute_num_layers with granularity None: accepted, nothing is recomputed",
        "silently-ignored",
        VALIDATOR,
        MCORE_CONFIG,
    ),
    Rule(
        "semantics.full-block-num-layers-zero",
        ("recompute_granularity", "recompute_method", "recompute_num_layers"),
        "full block with recompute_num_layers=0: accepted (the 1..layers-per-stage bound is never checked), "
        "no layer is recomputed",
        "silently-ignored",
        VALIDATOR,
        MCORE_CONFIG,
    ),
    Rule(
        "runtime.full-uniform-num-layers-zero-hangs",
        ("recompute_granularity", "recompute_method", "recompute_num_layers"),
        "full uniform with recompute_num_layers=0: accepted, then forward never returns (the uniform loop "
        "advances by recompute_num_layers)",
        "hang",
        RUNTIME,
        MCORE_RECOMPUTE,
    ),
    Rule(
        "semantics.labels-without-granularity",
        ("recompute_granularity", "recompute_modules"),
        "labels with granularity None: accepted (even unknown ones), nothing is recomputed",
        "silently-ignored",
        VALIDATOR,
        MCORE_CONFIG,
    ),
    Rule(
        "semantics.distribute-saved-activations-without-recompute",
        ("recompute_granularity", "distribute_saved_activations", "sequence_parallel"),
        "distribute_saved_activations with sequence_parallel but no recompute: accepted, no effect",
        "silently-ignored",
        VALIDATOR,
        MCORE_CONFIG,
    ),
    Rule(
        "semantics.mlp-on-moe-layers",
        ("recompute_modules", "num_moe_experts"),
        "selective mlp on MoE layers: no-op there (dense layers of mixed models still benefit)",
        "silently-ignored",
        LAYER_BUILD,
        SKILL,
    ),
    Rule(
        "semantics.moe_act-needs-te-grouped-mlp",
        ("recompute_modules", "transformer_impl"),
        "selective moe_act only acts in TE's grouped MLP; the local spec ignores it",
        "silently-ignored",
        LAYER_BUILD,
        MCORE_LAYER,
    ),
    Rule(
        "runtime.output-discard-needs-te-fp8-state",
        ("recompute_modules",),
        "output-discard labels (layernorm, mla_up_proj, moe_act, gdn_norm_out) fail in forward without "
        "Transformer Engine: CheckpointWithoutOutput always queries TE's FP8 state",
        "reject",
        RUNTIME,
        MCORE_LAYER,
    ),
    Rule(
        "bridge.ep-overlap-vs-moe-recompute",
        ("overlap_moe_expert_parallel_comm", "recompute_modules"),
        "Bridge's CommOverlapConfig refuses whole-moe recompute with expert-parallel overlap before MCore",
        "reject",
        BRIDGE,
        SKILL,
    ),
)


RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}


SUPERSEDED_RULE = "semantics.full-supersedes-selective"


_MESSAGE_PATTERNS = [(re.compile(rule.message, re.DOTALL), rule) for rule in RULES if rule.message]


def rule_for_message(message: str) -> str:
    """The id of the validator rule whose message this is; ``UNCLASSIFIED`` when none matches."""
    for pattern, rule in _MESSAGE_PATTERNS:
        if rule.outcome == "reject" and pattern.search(message):
            return rule.id
    return UNCLASSIFIED


def warning_rules_for(messages: Iterable[str]) -> tuple[str, ...]:
    """Ids of the warn-rules among MCore's warning messages, in matrix order, without repeats."""
    texts = list(messages)
    return tuple(
        rule.id
        for pattern, rule in _MESSAGE_PATTERNS
        if rule.outcome == "warn" and any(pattern.search(text) for text in texts)
    )
