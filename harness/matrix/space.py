"""The configurations the differential check draws from: every dimension the matrix reads.

Each dimension maps option names to the TransformerConfig fields the option sets; a scenario picks one
option per dimension plus a label list. Options bundle the prerequisites a feature needs to get past
unrelated validator rules (EP overlap comes with EP=2 and the alltoall dispatcher), while the
combinations across dimensions are free, so cross-feature rules are reached from every side.
The Hypothesis strategies (tests) and the seeded sampler (``matrix --check``, benchmark) share it.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from harness.matrix.validator_reads import RecomputeCheck, recompute_checks

# Labels outside the accepted set: a made-up one, a case variant, an empty item.
UNKNOWN_LABELS: tuple[str, ...] = ("not_a_label", "MLP", "")
MAX_LABELS = 4
# Chance a sampled dimension stays at its baseline. Context dimensions (parallelism, offloading,
# precision) mostly do, so that the features whose combinations the deep rules read (model, graphs,
# overlap, dropouts) vary freely without an unrelated prerequisite stopping the config first.
BASELINE_CHANCE = 0.8
FEATURE_BASELINE_CHANCE = 0.2
FEATURE_DIMENSIONS = (
    "model",
    "cuda_graph",
    "overlap",
    "attention_dropout",
    "hidden_dropout",
    "moe_input_jitter_eps",
)
UNKNOWN_LABEL_CHANCE = 0.1
UNSET_MODULES_CHANCE = 0.15
ALWAYS_DRAWN = ("recompute_granularity",)  # every granularity equally often
# Options that trip a prerequisite rule early; drawn rarely so that deeper rules get reached.
RARE_OPTIONS: frozenset[tuple[str, str]] = frozenset(
    {
        ("recompute_method", "'every'"),
        ("parallel", "tp1-sp"),
        ("parallel", "pp2-no-dtype"),
        ("overlap", "shared-expert-allgather"),
        ("overlap", "expert-parallel-allgather"),
        ("overlap", "expert-parallel-ep1"),
        ("cpu_offloading", "True"),
        ("cpu_offloading", "all-layers"),
        ("precision", "fp32"),
        ("moe_layer_recompute", "True"),
    }
)
RARE_CHANCE = 0.1

_MOE = {"num_moe_experts": 4, "add_bias_linear": False}
# The smallest Gated DeltaNet mix the validator accepts (GDN, then standard attention); the probe's
# gdn-tiny is built on it too (harness/models/gdn.py). Fewer key than value heads: MCore repeats q and k
# per value head, as in Qwen3-Next.
GATED_DELTA_NET: dict[str, Any] = {
    "experimental_attention_variant": "gated_delta_net",
    "linear_attention_freq": 2,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}


def _values(field: str, *values: Any) -> dict[str, dict[str, Any]]:
    return {repr(value): {field: value} for value in values}


# dimension -> option name -> fields. The first option of each dimension is its baseline.
DIMENSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "recompute_granularity": _values("recompute_granularity", None, "selective", "full", "partial"),
    "recompute_method": _values("recompute_method", None, "uniform", "block", "every"),
    "recompute_num_layers": _values("recompute_num_layers", None, 0, 1, 2),
    "model": {
        "dense": {"add_bias_linear": False},
        "moe": dict(_MOE),
        "moe-grouped-gemm": {**_MOE, "moe_grouped_gemm": True},
        "moe-te-op-fuser": {**_MOE, "use_transformer_engine_op_fuser": True},
        "moe-shared-experts": {**_MOE, "moe_shared_expert_intermediate_size": 64},
        "moe-mixed-dense": {**_MOE, "moe_layer_freq": [0, 1, 1, 1]},
        "moe-drop-pad": {
            **_MOE,
            "moe_expert_capacity_factor": 1.0,
            "moe_pad_expert_input_to_capacity": True,
        },
        "mla": {"multi_latent_attention": True},
        "gdn": dict(GATED_DELTA_NET),
    },
    "precision": {
        "bf16": {"bf16": True},
        "fp32": {},
        "fp16": {"fp16": True},
        "fp8-delayed": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "delayed"},
        "fp8-tensorwise": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "tensorwise"},
    },
    "cuda_graph": {
        "none": {},
        "local-whole-layer": {"cuda_graph_impl": "local", "cuda_graph_modules": []},
        "local-attn": {"cuda_graph_impl": "local", "cuda_graph_modules": ["attn"]},
        "local-mlp": {"cuda_graph_impl": "local", "cuda_graph_modules": ["mlp"]},
        "local-moe": {"cuda_graph_impl": "local", "cuda_graph_modules": ["moe"]},
        "local-moe_router": {"cuda_graph_impl": "local", "cuda_graph_modules": ["moe_router"]},
        "te-attn-mlp": {
            "cuda_graph_impl": "transformer_engine",
            "cuda_graph_modules": ["attn", "mlp"],
        },
        "te-moe": {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["moe"]},
        "te-moe_router": {
            "cuda_graph_impl": "transformer_engine",
            "cuda_graph_modules": ["moe_router"],
        },
        "te-moe-and-router": {
            "cuda_graph_impl": "transformer_engine",
            "cuda_graph_modules": ["moe", "moe_router"],
        },
        "full-iteration": {"cuda_graph_impl": "full_iteration", "cuda_graph_modules": []},
        "full-iteration-offload-bound": {
            "cuda_graph_impl": "full_iteration",
            "cuda_graph_modules": [],
            "fine_grained_offloading_max_inflight_offloads": 2,
        },
        "full-iteration-attn": {
            "cuda_graph_impl": "full_iteration",
            "cuda_graph_modules": ["attn"],
        },
    },
    "overlap": {
        "none": {},
        "shared-expert": {
            "moe_shared_expert_overlap": True,
            "moe_token_dispatcher_type": "alltoall",
        },
        "shared-expert-allgather": {"moe_shared_expert_overlap": True},
        "expert-parallel": {
            "overlap_moe_expert_parallel_comm": True,
            "expert_model_parallel_size": 2,
            "moe_token_dispatcher_type": "alltoall",
        },
        "expert-parallel-allgather": {
            "overlap_moe_expert_parallel_comm": True,
            "expert_model_parallel_size": 2,
        },
        "expert-parallel-ep1": {
            "overlap_moe_expert_parallel_comm": True,
            "moe_token_dispatcher_type": "alltoall",
        },
        "both": {
            "overlap_moe_expert_parallel_comm": True,
            "expert_model_parallel_size": 2,
            "moe_shared_expert_overlap": True,
            "moe_token_dispatcher_type": "alltoall",
        },
    },
    "parallel": {
        "tp1": {},
        "tp2": {"tensor_model_parallel_size": 2},
        "tp2-sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
        "tp1-sp": {"sequence_parallel": True},
        "pp2": {"pipeline_model_parallel_size": 2, "pipeline_dtype": torch.bfloat16},
        "pp2-no-dtype": {"pipeline_model_parallel_size": 2},
        "pp2-vpp2": {
            "pipeline_model_parallel_size": 2,
            "pipeline_dtype": torch.bfloat16,
            "virtual_pipeline_model_parallel_size": 2,
        },
    },
    "distribute_saved_activations": _values("distribute_saved_activations", False, True),
    "cpu_offloading": {
        **_values("cpu_offloading", False, True),
        "all-layers": {"cpu_offloading": True, "cpu_offloading_num_layers": 4},
    },
    "moe_layer_recompute": _values("moe_layer_recompute", False, True),
    "attention_dropout": _values("attention_dropout", 0.0, 0.1),
    "hidden_dropout": _values("hidden_dropout", 0.0, 0.1),
    "moe_input_jitter_eps": _values("moe_input_jitter_eps", None, 0.01),
}


DERIVED_BASELINE = (
    "default"  # a derived dimension's baseline: its fields at their declared defaults
)
# Options of one derived dimension at most (a product of the values its check compares fields with).
MAX_DERIVED_OPTIONS = 8


def _listed_fields() -> frozenset[str]:
    return frozenset(
        name for options in DIMENSIONS.values() for fields in options.values() for name in fields
    )


def _unlisted(check: RecomputeCheck) -> dict[str, tuple[Any, ...]]:
    listed = _listed_fields()
    return {name: values for name, values in check.values if name not in listed}


@cache
def dimensions() -> dict[str, dict[str, dict[str, Any]]]:
    """``DIMENSIONS``, then a dimension per recompute check of the installed validator that reads
    fields no listed option sets (``harness.matrix.validator_reads``): its options set those fields
    together, to the values the check's conditions compare them with, so a check that appears on a
    bump is sampled without an edit here."""
    derived: dict[str, dict[str, dict[str, Any]]] = {}
    for check in recompute_checks():
        unlisted = _unlisted(check)
        if not unlisted or not all(unlisted.values()):
            continue
        options = derived.setdefault("+".join(unlisted), {DERIVED_BASELINE: {}})
        for combination in itertools.islice(
            itertools.product(*unlisted.values()), MAX_DERIVED_OPTIONS
        ):
            fields = dict(zip(unlisted, combination, strict=True))
            options.setdefault(", ".join(f"{k}={v!r}" for k, v in fields.items()), fields)
    return {**DIMENSIONS, **derived}


def unreachable_fields() -> dict[str, tuple[str, ...]]:
    """Fields a recompute check reads that the space cannot set (none listed, no value derivable),
    each with the checks (``RecomputeCheck.where``) that read it."""
    found: dict[str, list[str]] = {}
    for check in recompute_checks():
        for name, values in _unlisted(check).items():
            if not values:
                found.setdefault(name, []).append(check.where)
    return {name: tuple(where) for name, where in found.items()}


@dataclass(frozen=True)
class Scenario:
    """One option per dimension, plus ``recompute_modules`` (None = unset)."""

    options: tuple[tuple[str, str], ...]
    modules: tuple[str, ...] | None

    @classmethod
    def baseline(cls) -> Scenario:
        return cls(tuple((dim, next(iter(opts))) for dim, opts in dimensions().items()), None)

    def fields(self) -> dict[str, Any]:
        """TransformerConfig keyword arguments (on top of the validator's base model)."""
        fields: dict[str, Any] = {}
        for dimension, option in self.options:
            fields.update(dimensions()[dimension][option])
        if self.modules is not None:
            fields["recompute_modules"] = list(self.modules)
        return fields

    def describe(self) -> str:
        """Only what differs from the baseline, for disagreement reports."""
        baseline = dict(Scenario.baseline().options)
        parts = [f"{dim}={opt}" for dim, opt in self.options if baseline[dim] != opt]
        if self.modules is not None:
            parts.append(f"recompute_modules={list(self.modules)}")
        return ", ".join(parts) or "baseline"


@cache
def options_of(dimension: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """``(baseline, common options, rare options)`` of a dimension."""
    baseline, *others = dimensions()[dimension]
    rare = tuple(option for option in others if (dimension, option) in RARE_OPTIONS)
    return baseline, tuple(option for option in others if option not in rare), rare


def _draw(rng: random.Random, dimension: str) -> str:
    baseline, common, rare = options_of(dimension)
    feature = dimension in FEATURE_DIMENSIONS
    chance = FEATURE_BASELINE_CHANCE if feature else BASELINE_CHANCE
    if dimension not in ALWAYS_DRAWN and rng.random() < chance:
        return baseline
    if rare and rng.random() < RARE_CHANCE:
        return rng.choice(rare)
    return rng.choice(common + ((baseline,) if dimension in ALWAYS_DRAWN or not common else ()))


def sample_scenarios(count: int, labels: frozenset[str], seed: int = 0) -> list[Scenario]:
    """``count`` scenarios, reproducibly: mostly baseline per dimension, trap options rarely."""
    rng = random.Random(seed)
    known = sorted(labels)

    def label() -> str:
        return (
            rng.choice(UNKNOWN_LABELS) if rng.random() < UNKNOWN_LABEL_CHANCE else rng.choice(known)
        )

    scenarios = []
    for _ in range(count):
        options = tuple((dimension, _draw(rng, dimension)) for dimension in dimensions())
        unset = rng.random() < UNSET_MODULES_CHANCE
        modules = None if unset else tuple(label() for _ in range(rng.randint(0, MAX_LABELS)))
        scenarios.append(Scenario(options, modules))
    return scenarios
