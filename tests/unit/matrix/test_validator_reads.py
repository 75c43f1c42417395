"""The validator's recompute checks, read from Megatron Core's source: the space derives from them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from harness.config.revisions import megatron_core_root
from harness.config.rules import RULES
from harness.config.validate import BASE_MODEL
from harness.matrix.space import DIMENSIONS, dimensions, unreachable_fields
from harness.matrix.validator_reads import recompute_checks


def _checks_reading(field: str) -> list[str]:
    return [check.where for check in recompute_checks() if field in check.reads]


def test_the_ep_overlap_checks_are_read_with_the_fields_they_guard():
    # MCore refuses every recompute field under EP overlap, one assert each, nested under one `if`.
    guarded = {
        name
        for check in recompute_checks()
        if "overlap_moe_expert_parallel_comm" in check.reads
        for name in check.reads
        if name.startswith("recompute_")
    }
    assert guarded == {
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "recompute_modules",
    }


def test_a_field_read_through_a_local_variable_counts_with_the_values_it_is_compared_with():
    # 0.19.2: `offload_inside_moe = {...} & set(self.offload_modules)`, then `assert not offload_inside_moe`.
    (check,) = [check for check in recompute_checks() if "offload_modules" in check.reads]
    values = dict(check.values)
    assert ["moe_act"] in values["offload_modules"]
    assert values["fine_grained_activation_offloading"] == (True,)


def test_the_space_sets_every_field_a_recompute_check_reads():
    settable = {
        name for options in dimensions().values() for fields in options.values() for name in fields
    }
    for check in recompute_checks():
        for name in check.reads:
            assert name.startswith("recompute_") or name in settable, (name, check.where)
    assert unreachable_fields() == {}
    # Some of them only by derivation: nothing in the listed space sets them.
    listed = {
        name for options in DIMENSIONS.values() for fields in options.values() for name in fields
    }
    assert "fine_grained_activation_offloading" in settable - listed


_FIELDS_ANCHOR = "    recompute_modules: Optional[List[str]] = None\n"
_CHECK_ANCHOR = "        if self.moe_layer_recompute:\n"
_NEW_FIELDS = "    harness_trial_flag: bool = False\n    harness_trial_size: Optional[int] = None\n"
_NEW_CHECKS = (
    '        if self.recompute_granularity == "selective" and self.harness_trial_flag:\n'
    '            raise ValueError("selective recompute is refused with harness_trial_flag")\n'
    '        if self.recompute_granularity == "full" and self.harness_trial_size is not None:\n'
    '            raise ValueError("full recompute is refused with harness_trial_size")\n'
)


# An edited copy of Megatron Core checked in a subprocess (~12 s): .ci/run's unreleased step, with
# the other edited trees (the comment-only edit) and the development head.
@pytest.mark.unreleased
def test_a_check_a_bump_adds_is_sampled_or_named_without_an_edit_to_the_space(tmp_path):
    # A copy of the installed Megatron Core whose validator gains two recompute checks on new fields:
    # a bool one (the space derives `True` and the check is met and reported as a disagreement) and
    # an int one no value can be derived for (reported as a field out of the space).
    root = megatron_core_root()
    assert root is not None
    copy = tmp_path / "megatron"
    shutil.copytree(root.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    config = copy / "core" / "transformer" / "transformer_config.py"
    text = config.read_text(encoding="utf-8")
    assert text.count(_FIELDS_ANCHOR) == 1 and text.count(_CHECK_ANCHOR) == 1
    text = text.replace(_FIELDS_ANCHOR, _FIELDS_ANCHOR + _NEW_FIELDS)
    config.write_text(text.replace(_CHECK_ANCHOR, _NEW_CHECKS + _CHECK_ANCHOR), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "matrix", "--check", "--count", "2000", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert [entry["field"] for entry in summary["fields_out_of_space"]] == ["harness_trial_size"]
    assert any(
        "harness_trial_flag=True" in cause and "selective recompute is refused" in cause
        for cause in summary["causes"]
    ), summary["causes"]


# What a rule may read that no option sets: the Transformer Engine version the oracle is given (not a
# config field) and the fields of the validator's base model, which every scenario builds on.
_NOT_CONFIG_FIELDS = {"transformer_engine"}


def test_the_space_sets_every_field_a_matrix_rule_reads():
    settable = {
        name for options in dimensions().values() for fields in options.values() for name in fields
    }
    for rule in RULES:
        if rule.predicate is None:
            continue
        unset = {
            name
            for name in rule.reads
            if not name.startswith("recompute_")
            and name not in settable | _NOT_CONFIG_FIELDS | set(BASE_MODEL)
        }
        assert not unset, f"{rule.id} reads {sorted(unset)}, which no option of the space sets"
