"""``plan --check-golden`` on the committed capacity goldens (the revisions step: each run builds the
recipe's whole model on the meta device, ~5-10 s on the 2-core machine, outside the tier's budget)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden"


def _plan(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "plan", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.revisions
@pytest.mark.parametrize("recipe", ["moonlight-full-8gpu", "nemotron-3-nano-full-16gpu"])
def test_the_committed_capacity_golden_matches(recipe):
    done = _plan("--recipe", recipe, "--check-golden")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "golden: the plan matches" in done.stdout


@pytest.mark.revisions
def test_a_row_that_moved_across_the_budget_fails_naming_rank_phase_and_module(tmp_path):
    # A golden in which `moe` was OOM at a smaller peak: what a Megatron Core bump that moved it
    # would leave behind. The check names the row, the rank span, the phase and the module.
    shutil.copytree(GOLDEN / "estimate", tmp_path / "estimate")
    shutil.copytree(GOLDEN / "capacity", tmp_path / "capacity")
    path = next((tmp_path / "capacity").glob("nemotron-3-nano-full-16gpu__*.json"))
    golden = json.loads(path.read_text())
    moe = next(row for row in golden["rows"] if row["label"] == "moe")
    moe["fits"], moe["status"] = False, "oom"
    moe["per_rank"][0]["phase"] = "forward/backward"
    path.write_text(json.dumps(golden))
    done = _plan(
        "--recipe", "nemotron-3-nano-full-16gpu", "--check-golden", "--golden-dir", str(tmp_path)
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "row 'moe': fits golden False, now True" in done.stdout
    assert (
        "row 'moe' ranks 0-15: phase golden 'forward/backward', now 'logits and cross entropy'"
        in done.stdout
    )


@pytest.mark.revisions
def test_a_non_positive_budget_is_one_line_and_exit_2():
    done = _plan("--recipe", "moonlight-full-8gpu", "--budget-gb", "0")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("--budget-gb must be positive, got 0.0")
