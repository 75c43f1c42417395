"""The Multi-Token Prediction family: dense-tiny with one MTP layer, and what keeps a tree from building it."""

from __future__ import annotations

import importlib

from harness.models.style import COMMON_KWARGS, DENSE_KWARGS, StyleModel

MTP_TINY = StyleModel(
    name="mtp-tiny",
    description=(
        "dense-tiny with one Multi-Token Prediction layer (mtp_num_layers 1, the MTP "
        "block from MCore's own spec) and a padding mask (the last 8 tokens of each "
        "sequence out of the loss): full recompute over the decoder and the MTP layer"
    ),
    config_kwargs={**COMMON_KWARGS, **DENSE_KWARGS, "num_layers": 2, "mtp_num_layers": 1},
    padding_tokens=8,
)


def mtp_needs_transformer_engine() -> str:
    """The head's ``MultiTokenPredictionLayer`` asks ``is_inference_column_parallel_linear`` about its
    projection, an ``isinstance`` against Transformer Engine classes that are not types without TE:
    the layer cannot be built there. Asked of the function itself, so a fixed tree builds again."""
    try:
        inference = importlib.import_module("megatron.core.tensor_parallel.inference_layers")
        inference.is_inference_column_parallel_linear(None)
    except (ImportError, AttributeError):
        return ""  # older trees: the MTP layer asks no such thing
    except TypeError as exc:
        return (
            "requires-TE: this Megatron Core's MultiTokenPredictionLayer cannot be built without "
            f"Transformer Engine (is_inference_column_parallel_linear: TypeError: {exc})"
        )
    return ""
