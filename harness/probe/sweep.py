"""The full-recompute rows a probe measures on a model: method x ``recompute_num_layers``, from its depth.

Megatron Core applies ``recompute_num_layers`` per pipeline stage: ``uniform`` checkpoints chunks of
that many layers, ``block`` checkpoints the first that many layers and runs the rest plainly. The
values that tell implementations apart are derived from the stage's layer count ``L``: 1, 2 and ``L``
(on a model of 4+ layers the three differ), the smallest count that does not divide ``L`` (uniform's
last chunk is short: Megatron-LM #3562 indexed past the last layer there) and ``L + 1`` (above the
count: the validator does not bound it, so what the revision does is the row's status). Nothing here
names a revision: each value is measured, and whatever the installed code does (a measurement, a
rejection, an exception) is the row's result. Where the revision's TransformerConfig has
``skip_final_recompute`` (Megatron-LM #4921), every pair is measured again with it set.
"""

from __future__ import annotations

import json
from importlib import resources

from harness.config.fields import RecomputeFields


def full_methods() -> tuple[str, ...]:
    """The recompute methods the probe measures (harness/data/probe-combinations.json)."""
    data = json.loads(
        resources.files("harness").joinpath("data/probe-combinations.json").read_text()
    )
    return tuple(data["full_methods"])


def num_layers_sweep(layers: int) -> tuple[int, ...]:
    """``recompute_num_layers`` values for a stage of ``layers`` layers, ascending, without repeats."""
    if layers < 1:
        raise ValueError(f"a stage has at least one layer, got {layers}")
    non_divisor = next((n for n in range(2, layers) if layers % n), None)
    values = {1, 2, layers, layers + 1} | ({non_divisor} if non_divisor else set())
    return tuple(sorted(values))


def full_recompute_fields(layers: int, *, skip_final: bool = False) -> list[RecomputeFields]:
    """Every (method, recompute_num_layers) pair for a stage of ``layers`` layers, method-major;
    with ``skip_final``, each pair again with ``skip_final_recompute`` set, after them."""
    return [
        RecomputeFields.full(method, num_layers, skip_final=skip)
        for skip in ((False, True) if skip_final else (False,))
        for method in full_methods()
        for num_layers in num_layers_sweep(layers)
    ]
