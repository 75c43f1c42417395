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


def test_skip_final_repeats_every_pair_after_the_plain_ones():
    plain = full_recompute_fields(2)
    assert full_recompute_fields(2, skip_final=True) == plain + [
        RecomputeFields.full(f.method or "", f.num_layers or 0, skip_final=True) for f in plain
    ]


def test_the_plan_asks_the_installed_config_for_skip_final_rows():
    # Megatron-LM #4921's field is in no supported revision's TransformerConfig: no such rows here
    # (commands/test_unreleased_trees.py measures them on the pull request's own tree).
    from harness.config.fields import SKIP_FINAL_FIELD
    from harness.config.validate import config_has_field

    has_field = config_has_field(SKIP_FINAL_FIELD)
    skip_rows = [row for row in plan_rows(layers=4) if row.fields.skip_final]
    assert len(skip_rows) == (10 if has_field else 0)
    assert config_has_field("recompute_num_layers")


def test_modules_names_full_rows_beside_label_sets():
    from harness.errors import UsageError
    from harness.probe.plan import parse_label_sets

    named = parse_label_sets(["core_attn", "mlp+layernorm", "full-block-2"])
    rows = plan_rows(named, layers=4)
    assert [row.label for row in rows] == ["[]", "core_attn", "mlp+layernorm", "full-block-2"]
    assert rows[-1].fields == RecomputeFields.full("block", 2)
    with pytest.raises(UsageError, match="full-<method>-<layers>"):
        parse_label_sets(["full-block"])
    with pytest.raises(UsageError, match="unknown recompute label"):
        parse_label_sets(["fullblock-2"])
