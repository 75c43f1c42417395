"""The recompute fields as one value and the row syntax (harness.config.fields)."""

from __future__ import annotations

import pytest

from harness.config.fields import SKIP_FINAL_FIELD, RecomputeFields
from harness.errors import UsageError


def test_a_skip_final_row_round_trips_through_its_name():
    fields = RecomputeFields.parse("full-block-2-skip-final")
    assert fields == RecomputeFields.full("block", 2, skip_final=True)
    assert fields.name == "full-block-2-skip-final"
    assert RecomputeFields.parse("full-block-2").skip_final is False


def test_skip_final_is_written_and_passed_to_megatron_core_only_when_set():
    # Records and goldens from before the field (and revisions without it) see the four keys alone.
    plain = RecomputeFields.full("uniform", 1)
    assert SKIP_FINAL_FIELD not in plain.as_dict()
    assert SKIP_FINAL_FIELD not in plain.as_config_kwargs()
    skipping = RecomputeFields.full("uniform", 1, skip_final=True)
    assert skipping.as_dict()[SKIP_FINAL_FIELD] is True
    assert skipping.as_config_kwargs()[SKIP_FINAL_FIELD] is True
    assert RecomputeFields.from_dict(skipping.as_dict()) == skipping
    assert RecomputeFields.from_dict(plain.as_dict()) == plain


@pytest.mark.parametrize("name", ["full-uniform-skip-final", "full--skip-final", "full-block-x"])
def test_a_malformed_full_row_is_a_usage_error(name):
    with pytest.raises(UsageError, match=r"full-<method>-<layers>\[-skip-final\]"):
        RecomputeFields.parse(name)
