"""``diff A B`` refuses what is not a probeable Megatron Core tree: one line, exit 2, nothing written.
(Diffs of real trees, end to end, are the unreleased step's: tests/unit/commands/test_unreleased_trees.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.revisions import megatron_core_root

REPO = Path(__file__).resolve().parents[3]


def diff(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "diff", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def installed_tree() -> Path:
    root = megatron_core_root()
    assert root is not None, "the CPU tier runs on an installed Megatron Core"
    return root.parent.parent


def test_a_directory_without_megatron_core_is_refused(tmp_path):
    done = diff(str(installed_tree()), str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        f"recompute-harness: error: {tmp_path}: holds no megatron/core (give a checkout, an "
        "exported tree or a site-packages)"
    )


def test_a_tree_missing_the_validator_is_refused(tmp_path):
    (tmp_path / "megatron" / "core" / "tensor_parallel").mkdir(parents=True)
    (tmp_path / "megatron" / "core" / "tensor_parallel" / "random.py").write_text("")
    done = diff(str(installed_tree()), str(tmp_path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "is not a Megatron Core tree: missing transformer/transformer_config.py" in done.stderr


# Both sides import torch before the broken one fails (~15 s under the tier's load): .ci/run's
# unreleased step, beside the diffs of real trees.
@pytest.mark.unreleased
def test_a_tree_that_cannot_be_imported_is_refused_naming_why(tmp_path):
    core = tmp_path / "megatron" / "core"
    for relative in (
        "transformer/transformer_config.py",
        "model_parallel_config.py",
        "tensor_parallel/random.py",
    ):
        (core / relative).parent.mkdir(parents=True, exist_ok=True)
        (core / relative).write_text("")
    (core / "__init__.py").write_text("raise ImportError('this tree is broken')\n")
    before = sorted(tmp_path.rglob("*"))
    done = diff(str(installed_tree()), str(tmp_path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (
        f"{tmp_path}: this Megatron Core cannot be probed (exit 1): ImportError: this tree is broken"
        in done.stderr
    )
    assert sorted(tmp_path.rglob("*")) == before  # nothing written into the tree
