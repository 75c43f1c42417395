"""The dense family: standard attention and a SwiGLU MLP (Llama-style), shallow and deep."""

from __future__ import annotations

from harness.models.style import COMMON_KWARGS, DENSE_KWARGS, StyleModel

DENSE_TINY = StyleModel(
    name="dense-tiny",
    description="standard attention + dense SwiGLU MLP, RMSNorm, 2 layers (Llama-style)",
    config_kwargs={**COMMON_KWARGS, **DENSE_KWARGS, "num_layers": 2},
)

DENSE_DEEP = StyleModel(
    name="dense-deep",
    description=(
        "dense-tiny's layers, 4 deep: full recompute's uniform and block differ at "
        "recompute_num_layers 1, 2 and 4, and 3 does not divide the layers"
    ),
    config_kwargs={**COMMON_KWARGS, **DENSE_KWARGS, "num_layers": 4},
)
