"""Tiny "style" models built from Megatron Core's own specs: shaped like the real ones, small enough for CPU.

Every model is a real ``GPTModel`` from the local (non-TE) spec with the recompute fields under test,
except ``nemotron-h-tiny``: Megatron Core's ``HybridModel`` (Mamba, attention and MoE layers) over the
same local modules (``hybrid_stack_spec``). Components of ours are core attentions and the hybrid
stack's final norm (``hybrid._local_norm_hybrid_stack``: MCore builds it as ``TENorm`` unconditionally); the
Mamba mixer's CUDA kernels are the CPU adapter's stand-ins (harness/cpu/mamba_kernels.py), as are
the fla kernels of ``gdn-tiny``'s Gated DeltaNet and ``gdp-tiny``'s GatedDeltaProduct (MCore's layers;
harness/cpu/linear_attention.py); ``gdp-tiny`` is a ``HybridModel`` too.
``KVChannelsDotProductAttention``: MCore's MLA builds its core attention with ``k_channels`` /
``v_channels``, which the local ``DotProductAttention`` does not accept; ours accepts them so MCore's
MLA projection code (where ``mla_up_proj`` lives) runs unmodified. ``FusedCoreAttention`` (harness/cpu/attention.py) for ``attention_backend="fused"``.
MoE models with ``moe_grouped_gemm`` (every MoE style model, as both GPU recipes) take their experts
from MCore's Transformer Engine spec (``moe.grouped_gemm_experts``): ``TEGroupedMLP``, whose linears
are the CPU adapter's stand-ins of TE's grouped linear where TE is absent (harness/cpu/grouped_linear.py).

``build_model`` is device-agnostic: the CPU probe calls it after ``enable_cpu_adapter()``; the runner's
``mcore`` back end calls it on CPU (under the adapter) and with ``device="cuda"`` on GPU.

One module per family, as torchtitan keeps ``models/<family>/``: ``dense``, ``mtp``, ``mhc``,
``gdn`` (Gated DeltaNet), ``moe`` (MLA + MoE: Moonlight, Nemotron's attention + MoE part), ``hybrid``
(Mamba-2 and GatedDeltaProduct hybrids); ``style`` says what a style model is, ``catalog`` lists them,
``attention`` picks the core attention, ``build`` builds one.
"""

from harness.models.attention import set_core_attention
from harness.models.build import TinyModel, build_model, sequence_parallel_norm, transformer_config
from harness.models.catalog import (
    STYLE_MODELS,
    buildable_model,
    buildable_models,
    not_on_this_tree,
    not_probed_lines,
    style_model,
)
from harness.models.hybrid import hybrid_stack_spec
from harness.models.moe import grouped_gemm_experts
from harness.models.style import StyleModel

__all__ = [
    "STYLE_MODELS",
    "StyleModel",
    "TinyModel",
    "build_model",
    "buildable_model",
    "buildable_models",
    "grouped_gemm_experts",
    "hybrid_stack_spec",
    "not_on_this_tree",
    "not_probed_lines",
    "sequence_parallel_norm",
    "set_core_attention",
    "style_model",
    "transformer_config",
]
