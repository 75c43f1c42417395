"""The manifold-constrained hyper-connections (mHC) family: dense-tiny's layers with 4 residual streams."""

from __future__ import annotations

import importlib
from typing import Any

from harness.models.style import COMMON_KWARGS, DENSE_KWARGS, StyleModel

MHC_TINY = StyleModel(
    name="mhc-tiny",
    description=(
        "dense-tiny with manifold-constrained hyper-connections (4 residual streams, "
        "HyperConnectionTransformerLayer): the model of the mhc label; a Megatron Core "
        "that has them (0.20 / main) only"
    ),
    config_kwargs={
        **COMMON_KWARGS,
        **DENSE_KWARGS,
        "num_layers": 2,
        "enable_mhc_connections": True,
    },
    hyper_connections=True,
)


def hyper_connection_classes() -> tuple[type, type] | None:
    # By name: the oldest supported Megatron Core (and the type checker's) has neither.
    try:
        connection = importlib.import_module("megatron.core.transformer.hyper_connection")
        layer = importlib.import_module("megatron.core.transformer.transformer_layer")
        return layer.HyperConnectionTransformerLayer, connection.HyperConnectionModule
    except (ImportError, AttributeError):
        return None


def use_hyper_connections(block_spec: Any) -> None:
    """Every layer of ``block_spec`` as a ``HyperConnectionTransformerLayer`` with a
    ``HyperConnectionModule`` around attention and MLP (the layer refuses to build without both)."""
    classes = hyper_connection_classes()
    assert classes is not None, "build_model refuses the model first (buildable_model)"
    layer, connection = classes
    for spec in block_spec.layer_specs:
        spec.module = layer
        spec.submodules.self_attention_hyper_connection = connection
        spec.submodules.mlp_hyper_connection = connection
