"""One real Megatron Core layer of each kind, at the recipe's per-rank widths, measured.

MoE layers with ``moe_grouped_gemm`` build their experts as the GPU run does
(``Architecture.te_grouped_experts``): for Bridge's recipes and Megatron-LM's TE implementation as
MCore's TE spec does, ``TEGroupedMLP`` (on the CPU adapter's grouped-linear stand-ins), so
``moe_act`` is measured; for the mcore back end ``SequentialMLP``, where it is requires-TE.

The layer is MCore's own (``build_module`` of a layer spec: ``get_gpt_decoder_block_spec`` on the
local spec for a GPT model; for a hybrid model the kind's layer of ``harness.models.hybrid_stack_spec``,
MCore's hybrid stack spec over local modules: ``MambaLayer`` + ``MambaMixer`` on the CPU adapter's
kernel stand-ins, attention-only ``TransformerLayer``, ``MLPLayer``, ``MoETransformerLayer``), its
norms as on GPU (``_gpu_norms``; a hybrid's attention and MLP norms fused into the next linear as
MCore's TE hybrid spec places them, ``_te_hybrid_norms``), in the recipe's precision, with the row's recompute fields and the
chosen core attention (under ``fused``, attention dropout is set to 0: GPU fused kernels keep only an
RNG seed for it, no bytes, and the CPU flash kernel has none); the running model-parallel state gives the tensor-parallel split (and sequence parallel with it), so every
sharded width is MCore's. Its input is the ``[s/tp, b, h]`` hidden state a previous layer hands it
(counted: in a stack it is the previous layer's output, saved by this layer's input norm).

Retained bytes are what autograd still holds when the layer's forward returns
(``harness.probe.measurement.measure.retained_by_forward``), attributed to the innermost module that saved them.
The causal mask is excluded: a model builds it once and every layer shares it.

Weights: the first row's layer draws them (MCore's init is skipped: ``perform_initialization`` off,
``_draw_weights`` instead, far cheaper at 64 experts), and every other row's layer of the same kind
shares the very tensors, so routing is identical across rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.config.fields import RecomputeFields
from harness.cpu.norm import FusedRMSNorm, norm_column_parallel_linear
from harness.estimate.model import ATTENTION, CPU_FLAGS, MAMBA, MLP, MOE, Architecture
from harness.models import (
    grouped_gemm_experts,
    hybrid_stack_spec,
    sequence_parallel_norm,
    set_core_attention,
    transformer_config,
)
from harness.probe.measurement.measure import retained_by_forward
from harness.probe.measurement.peaks import live_activation_bytes, memory_tracker

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# A hybrid layer kind -> its field of MCore's HybridStackSubmodules.
HYBRID_LAYER_SPECS = {
    MAMBA: "mamba_layer",
    ATTENTION: "attention_layer",
    MLP: "mlp_layer",
    MOE: "moe_layer",
}


@dataclass
class LayerPeaks:
    """What one layer's step adds, for a moment, on top of what it retains (MemTracker).

    ``forward_transient``: activation + temporary bytes alive at the layer's forward peak beyond
    those alive when its forward returned (its intermediates before autograd frees them);
    ``backward_transient``: the same at its backward peak (replayed activations, activation
    gradients, the incoming gradient), beyond those alive when backward started. Parameter gradients
    are left out (dropped as they accumulate, so they do not decide the peak moment either): a GPU
    recipe's DDP keeps them in a grad buffer allocated before the first step.
    """

    seq_length: int
    forward_transient: int
    backward_transient: int


@dataclass
class LayerMeasurement:
    """Retained bytes of one layer forward at one sequence length (full sequence, all TP ranks)."""

    seq_length: int
    retained_bytes: int
    attribution: dict[str, int] = field(default_factory=dict)


def layer_config(
    arch: Architecture,
    fields: RecomputeFields,
    kind: str,
    *,
    precision: str,
    etp: int | None = None,
    dropout: bool = False,
) -> Any:
    """The real TransformerConfig of a one-layer model of ``kind`` (the validator runs here)."""
    from megatron.core import parallel_state as ps

    config = arch.config
    overrides: dict[str, Any] = {**CPU_FLAGS, "num_layers": 1, "perform_initialization": False}
    if "num_moe_experts" in config and not arch.style.hybrid_pattern:
        overrides["moe_layer_freq"] = [1 if kind == MOE else 0]
    if ps.get_tensor_model_parallel_world_size() > 1:
        overrides["sequence_parallel"] = True
    if etp is not None:
        overrides["expert_tensor_parallel_size"] = etp
    if not dropout:
        overrides["hidden_dropout"] = config.get("hidden_dropout", 0.0)
        overrides["attention_dropout"] = config.get("attention_dropout", 0.0)
    return transformer_config(
        arch.style, fields, dropout=dropout, dtype=DTYPES[precision], **overrides
    )


def build_layer(
    arch: Architecture,
    fields: RecomputeFields,
    kind: str,
    *,
    precision: str,
    attention_backend: str,
    etp: int | None = None,
    dropout: bool = False,
    weights_from: torch.nn.Module | None = None,
    seed: int = 1234,
) -> torch.nn.Module:
    """One MCore layer of ``kind``; weights drawn, or shared with ``weights_from``."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.spec_utils import build_module

    config = layer_config(arch, fields, kind, precision=precision, etp=etp, dropout=dropout)
    if attention_backend == "fused":
        config.attention_dropout = 0.0
    # A hybrid stack hands its layers the model's process groups (MambaLayer requires them): the
    # running model-parallel state's, as HybridModel takes them by default.
    groups = (
        {"pg_collection": ProcessGroupCollection.use_mpu_process_groups()}
        if arch.style.hybrid_pattern
        else {}
    )
    layer = build_module(
        _layer_spec(arch, config, kind, attention_backend),
        config=config,
        layer_number=1,
        **groups,
    )
    if weights_from is not None:
        # Assigned (the very tensors, no copy), except into a Mamba layer: MCore's MambaMixer hands
        # its conv1d weight and bias, A_log, D and dt_bias to its context-parallel helper when it is
        # built, and the forward reads them there, so assigned tensors would leave it the unset
        # ones (and their bytes counted as saved activations); copied values reach both.
        layer.load_state_dict(weights_from.state_dict(), strict=True, assign=kind != MAMBA)
    else:
        _draw_weights(layer, seed)
    layer.train()
    return layer


def _layer_spec(arch: Architecture, config: Any, kind: str, attention_backend: str) -> Any:
    """The layer spec of ``kind``: a hybrid stack's layer, or the GPT decoder block's only layer."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if arch.style.hybrid_pattern:
        spec = getattr(
            hybrid_stack_spec(config, attention_backend).submodules, HYBRID_LAYER_SPECS[kind]
        )
        _te_hybrid_norms(spec, kind)
        _gpu_norms([spec], config.normalization, config.sequence_parallel)
        if kind == MOE and arch.te_grouped_experts:
            spec.submodules.mlp = grouped_gemm_experts(spec.submodules.mlp, config)
        return spec
    block_spec = get_gpt_decoder_block_spec(
        config, use_transformer_engine=False, normalization=config.normalization
    )
    for layer_spec in block_spec.layer_specs if arch.te_grouped_experts else ():
        layer_spec.submodules.mlp = grouped_gemm_experts(layer_spec.submodules.mlp, config)
    set_core_attention(block_spec, attention_backend, arch.style.mla)
    _gpu_norms(block_spec.layer_specs, config.normalization, config.sequence_parallel)
    return block_spec.layer_specs[0]


def _te_hybrid_norms(layer_spec: Any, kind: str) -> None:
    """The norms where MCore's TE hybrid spec has them: the attention layer's input norm fused into
    ``linear_qkv`` and the MLP layer's pre-MLP norm into ``linear_fc1`` (``TELayerNormColumnParallelLinear``,
    the layer's own norm an ``IdentityOp``, so MCore's ``layernorm`` recompute does not reach them,
    as on a GPU); the Mamba layer's norm is fused into ``in_proj`` there too, but ``MambaLayer`` has
    no selective recompute, so its separate local norm keeps the same bytes and is left; the MoE
    layer's pre-MLP norm is a separate ``TENorm`` in both."""
    from megatron.core.transformer.identity_op import IdentityOp

    submodules = layer_spec.submodules
    fused = norm_column_parallel_linear()
    if kind == ATTENTION:
        submodules.input_layernorm = IdentityOp
        submodules.self_attention.submodules.linear_qkv = fused
    elif kind == MLP:
        submodules.pre_mlp_layernorm = IdentityOp
        mlp = submodules.mlp  # a ModuleSpec, or (0.19.2) partial(MLP.as_mlp_submodule, ...)
        mlp_submodules = (
            mlp.keywords["submodules"] if isinstance(mlp, functools.partial) else mlp.submodules
        )
        mlp_submodules.linear_fc1 = fused


_PATTERN_ELEMENTS = 1 << 20


def _draw_weights(layer: torch.nn.Module, seed: int) -> None:
    """Norm weights 1, every other weight tiled from one block of N(0, 0.02²) draws: values matter to
    byte counts only through routing (the router's weight is small, so it is drawn in full), and
    drawing half a billion expert weights one by one costs ~10 s per rank."""
    generator = torch.Generator().manual_seed(seed)
    pattern = torch.randn(_PATTERN_ELEMENTS, generator=generator) * 0.02
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0)
                continue
            flat = parameter.view(-1)
            if flat.numel() <= _PATTERN_ELEMENTS:
                flat.copy_(torch.randn(flat.numel(), generator=generator) * 0.02)
                continue
            for start in range(0, flat.numel(), _PATTERN_ELEMENTS):
                chunk = flat[start : start + _PATTERN_ELEMENTS]
                chunk.copy_(pattern[: chunk.numel()])


def _gpu_norms(layer_specs: list[Any], normalization: str, sequence_parallel: bool) -> None:
    """The layer norms as a GPU recipe's: RMSNorm -> ``FusedRMSNorm`` (what TE's keeps); LayerNorm
    stays torch's (``native_layer_norm`` keeps input, mean and rstd on CPU as on GPU), under SP as
    ``harness.models.sequence_parallel_norm`` builds it (forward-only here: no gradient is ever
    reduced)."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    replacement = (
        FusedRMSNorm
        if normalization == "RMSNorm"
        else sequence_parallel_norm
        if sequence_parallel
        else None
    )
    if replacement is None:
        return
    for layer_spec in layer_specs:
        for name in ("input_layernorm", "pre_mlp_layernorm", "norm"):  # norm: MambaLayer's
            if getattr(layer_spec.submodules, name, None) is WrappedTorchNorm:
                setattr(layer_spec.submodules, name, replacement)


def measure_layer(
    layer: torch.nn.Module, seq_length: int, micro_batch_size: int, *, seed: int = 0
) -> LayerMeasurement:
    """Forward ``layer`` once on this rank's ``[s/tp, b, h]`` slice; retained bytes at its end."""

    hidden, mask = _layer_input(layer, seq_length, micro_batch_size, seed)
    output, retained, attribution = retained_by_forward(
        layer, lambda: layer(hidden, attention_mask=mask), shared=(mask,)
    )
    del output
    return LayerMeasurement(seq_length, retained, {k: v for k, v in attribution.items() if v})


def _layer_input(
    layer: torch.nn.Module, seq_length: int, micro_batch_size: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``[s/tp, b, h]`` hidden state (requiring grad, as in a stack) and the causal mask."""
    from megatron.core import parallel_state as ps

    config = layer.config
    tp = ps.get_tensor_model_parallel_world_size()
    local = seq_length // tp if config.sequence_parallel else seq_length
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(local, micro_batch_size, config.hidden_size, generator=generator).to(
        config.params_dtype
    )
    hidden.requires_grad_(True)
    mask = torch.triu(torch.ones(seq_length, seq_length, dtype=torch.bool), diagonal=1)[None, None]
    return hidden, mask


def measure_layer_peaks(
    layer: torch.nn.Module, seq_length: int, micro_batch_size: int, *, seed: int = 0
) -> LayerPeaks:
    """Forward + backward of ``layer`` under MemTracker; its transients (``LayerPeaks``)."""
    hidden, mask = _layer_input(layer, seq_length, micro_batch_size, seed)
    # Each parameter gradient is dropped once accumulated: they are not part of the transients, and
    # 64 experts' gradients would double a rank's memory (1.1 GB for Moonlight in bf16).
    drops = [
        parameter.register_post_accumulate_grad_hook(_drop_gradient)
        for parameter in layer.parameters()
        if parameter.requires_grad
    ]
    tracker = memory_tracker()
    tracker.track_external(layer, hidden, mask)
    try:
        with tracker:
            output = _hidden_output(layer(hidden, attention_mask=mask))
            forward_peak = live_activation_bytes(tracker.get_tracker_snapshot("peak"))
            after_forward = live_activation_bytes(tracker.get_tracker_snapshot("current"))
            output.backward(torch.ones_like(output))
    finally:
        for drop in drops:
            drop.remove()
    backward_peak = live_activation_bytes(
        tracker.memory_tracking[layer].snapshots["Peak-Backward"][-1]
    )
    return LayerPeaks(
        seq_length,
        max(forward_peak - after_forward, 0),
        max(backward_peak - after_forward, 0),
    )


def _hidden_output(output: Any) -> torch.Tensor:
    """The layer's output hidden state: ``TransformerLayer`` returns ``(hidden, context)``,
    ``MambaLayer`` the hidden state alone."""
    return output if isinstance(output, torch.Tensor) else output[0]


def _drop_gradient(parameter: torch.Tensor) -> None:
    parameter.grad = None
