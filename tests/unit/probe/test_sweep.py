"""The full-recompute rows derived from a model's depth (harness.probe.sweep)."""

from __future__ import annotations

import pytest

from harness.config.fields import RecomputeFields
from harness.probe.plan import plan_rows
from harness.probe.sweep import full_recompute_fields, num_layers_sweep


@pytest.mark.parametrize(
    "layers, expected",
    [
        (1, (1, 2)),  # 2 is already above the count
        (2, (1, 2, 3)),  # every count 1..2 divides 2: no short last chunk
        (3, (1, 2, 3, 4)),  # 2 does not divide 3
        (4, (1, 2, 3, 4, 5)),  # 3 does not divide 4 (#3562's short chunk), 5 is above the count
        (6, (1, 2, 4, 6, 7)),  # 4 is the smallest non-divisor of 6
    ],
)
def test_num_layers_sweep_has_one_two_the_count_a_non_divisor_and_one_above(layers, expected):
    assert num_layers_sweep(layers) == expected


def test_a_stage_without_layers_is_refused():
    with pytest.raises(ValueError, match="at least one layer"):
        num_layers_sweep(0)


def test_every_method_is_swept_at_every_value():
    # harness/data/probe-combinations.json lists uniform, then block.
    assert full_recompute_fields(2) == [
        RecomputeFields.full("uniform", 1),
        RecomputeFields.full("uniform", 2),
        RecomputeFields.full("uniform", 3),
        RecomputeFields.full("block", 1),
        RecomputeFields.full("block", 2),
        RecomputeFields.full("block", 3),
    ]


def test_the_plan_takes_its_full_rows_from_the_models_depth():
    full = [row.label for row in plan_rows(layers=4) if row.fields.granularity == "full"]
    assert full == [f"full-{m}-{n}" for m in ("uniform", "block") for n in (1, 2, 3, 4, 5)]
