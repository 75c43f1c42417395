"""``diff`` names the recompute surface itself: a ``TransformerConfig`` field added that the recompute
sources read (Megatron-LM #4921's ``skip_final_recompute``), not only the probe values it moves."""

from __future__ import annotations

import shutil

import pytest
from overlays import pull_request_trees

from harness.compare.tree_diff import recompute_field_changes
from harness.config.revisions import megatron_core_root


def test_a_config_field_read_by_the_recompute_path_is_named(tmp_path):
    installed = megatron_core_root()
    copy = tmp_path / "core"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    config = copy / "transformer" / "transformer_config.py"
    config.write_text(
        config.read_text().replace(
            "class TransformerConfig(ModelParallelConfig):\n",
            "class TransformerConfig(ModelParallelConfig):\n    skip_last_unit: bool = False\n"
            "    unread_field: bool = False\n",
        )
    )
    recompute = copy / "recompute.py"
    recompute.write_text(
        recompute.read_text() + '\n_SKIP = lambda config: getattr(config, "skip_last_unit", 0)\n'
    )
    # Only the field a recompute source names is the recompute surface's; removing it reads back.
    assert recompute_field_changes(installed, copy) == (
        ["skip_last_unit (read by recompute.py)"],
        [],
    )
    assert recompute_field_changes(copy, installed) == (
        [],
        ["skip_last_unit (read by recompute.py)"],
    )


@pytest.mark.unreleased
def test_pull_request_4921_names_skip_final_recompute():
    try:
        base, head = pull_request_trees(4921)
    except LookupError as exc:
        pytest.skip(f"no Megatron-LM pull request #4921: {exc}")
    assert recompute_field_changes(base / "megatron" / "core", head / "megatron" / "core") == (
        ["skip_final_recompute (read by recompute.py)"],
        [],
    )
