"""Every style model by name, and which of them the imported Megatron Core can build."""

from __future__ import annotations

import importlib.util

from harness.errors import UsageError
from harness.models.dense import DENSE_DEEP, DENSE_TINY
from harness.models.gdn import GDN_TINY
from harness.models.hybrid import GDP_MODULE, GDP_TINY, NEMOTRON_H_TINY
from harness.models.mhc import MHC_TINY, hyper_connection_classes
from harness.models.moe import MOONLIGHT_TINY, NEMOTRON_TINY
from harness.models.mtp import MTP_TINY, mtp_needs_transformer_engine
from harness.models.style import StyleModel

# In the order ``probe --all`` probes them and ``probe --list`` lists them.
STYLE_MODELS: dict[str, StyleModel] = {
    model.name: model
    for model in (
        DENSE_TINY,
        DENSE_DEEP,
        MTP_TINY,
        MHC_TINY,
        GDN_TINY,
        MOONLIGHT_TINY,
        NEMOTRON_TINY,
        NEMOTRON_H_TINY,
        GDP_TINY,
    )
}


def style_model(name: str) -> StyleModel:
    try:
        return STYLE_MODELS[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; known: {', '.join(STYLE_MODELS)}") from None


def not_on_this_tree(style: StyleModel) -> str:
    """Why the imported Megatron Core cannot build ``style`` ("" when it can)."""
    if style.hyper_connections and hyper_connection_classes() is None:
        return "this Megatron Core has no HyperConnectionTransformerLayer (mHC: 0.20 / main)"
    if style.gated_delta_product and importlib.util.find_spec(GDP_MODULE) is None:
        return f"this Megatron Core has no GatedDeltaProduct ({GDP_MODULE}: main)"
    if style.config_kwargs.get("mtp_num_layers"):
        return mtp_needs_transformer_engine()
    return ""


def buildable_models() -> list[str]:
    """The style models the imported Megatron Core can build: what ``probe --all`` probes."""
    return [name for name, style in STYLE_MODELS.items() if not not_on_this_tree(style)]


def not_probed_lines() -> list[str]:
    """``not probed here: <model>: <why>`` for each style model the imported Megatron Core cannot
    build: what ``probe --all`` and ``bump`` say they left out."""
    return [
        f"not probed here: {name}: {why}"
        for name, style in STYLE_MODELS.items()
        if (why := not_on_this_tree(style))
    ]


def buildable_model(name: str) -> StyleModel:
    """``style_model(name)``, refused in one line where this Megatron Core cannot build it."""
    style = style_model(name)
    missing = not_on_this_tree(style)
    if missing:
        raise UsageError(f"model {name!r} cannot be built here: {missing}")
    return style
