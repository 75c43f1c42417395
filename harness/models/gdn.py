"""The Gated DeltaNet family (Qwen3-Next style): linear attention mixed with standard attention in a
GPT decoder, built from Megatron Core's own GDN module spec on the local back end."""

from __future__ import annotations

import copy
import types
from typing import Any

import torch

from harness.cpu.deferred_compile import eager_form
from harness.matrix.space import GATED_DELTA_NET
from harness.models.style import COMMON_KWARGS, DENSE_KWARGS, StyleModel

GDN_TINY = StyleModel(
    name="gdn-tiny",
    description=(
        "Qwen3-Next style: Gated DeltaNet linear attention mixed with standard attention "
        "(experimental_attention_variant gated_delta_net, linear_attention_freq 2: GDN "
        "then attention), dense SwiGLU MLP, RMSNorm, 2 layers; the GDN layer from MCore's "
        "own module spec, its fla kernels CPU stand-ins"
    ),
    config_kwargs={
        **COMMON_KWARGS,
        **DENSE_KWARGS,
        "num_layers": 2,
        **GATED_DELTA_NET,
    },
)


def decoder_block_spec(config: Any) -> Any:
    """MCore's local decoder block spec for ``config``; with a linear-attention variant, MCore's own
    Gated DeltaNet spec in the layers ``linear_attention_freq`` gives it.

    MCore builds that mix only from Transformer Engine specs: its local spec refuses a config with an
    attention variant, so the local layers are built from the config without it (a copy: the
    validated config itself is untouched) and the GDN layers from ``get_gated_delta_net_module_spec``
    with the local back end. That back end has no fused norm + linear, so the GDN input projection is
    its plain column-parallel linear and the layer keeps its own input norm (as TE's fused one would
    compute it).
    """
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    variant = config.experimental_attention_variant
    plain = copy.copy(config)
    plain.experimental_attention_variant = None
    block_spec = get_gpt_decoder_block_spec(
        plain, use_transformer_engine=False, normalization=config.normalization
    )
    if variant is None:
        return block_spec
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_gated_delta_net_module_spec,
        get_linear_attention_pattern,
    )

    local = LocalSpecProvider()
    gdn = get_gated_delta_net_module_spec(config, backend=local)
    gdn.submodules.in_proj = local.column_parallel_linear()
    pattern = get_linear_attention_pattern(config)
    # The local spec shares one layer spec between layers: each GDN layer gets a copy of its own.
    for index, (layer_spec, linear) in enumerate(zip(block_spec.layer_specs, pattern, strict=True)):
        if linear:
            block_spec.layer_specs[index] = layer_spec = copy.deepcopy(layer_spec)
            layer_spec.submodules.self_attention = gdn
    return block_spec


def run_linear_attention_helpers_eagerly(module: torch.nn.Module) -> None:
    """On CPU, the ``torch.compile``d (``jit_fuser``) methods of MCore's SSM-family layers (the Gated
    DeltaNet's gated norm, kernel-input preparation, decay and beta) run eagerly on each layer: the
    same functions, without Inductor's C++ builds (seconds per helper, dtype and grad mode), as
    nemotron-tiny's squared ReLU. Autograd then keeps what eager PyTorch keeps in those helpers."""
    for layer in module.modules():
        if not type(layer).__module__.startswith("megatron.core.ssm."):
            continue
        for cls in type(layer).__mro__:
            for name, attribute in vars(cls).items():
                eager = eager_form(attribute)
                if eager is not None and name not in vars(layer):
                    setattr(layer, name, types.MethodType(eager, layer))
