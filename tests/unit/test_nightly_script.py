"""ci/nightly-gpu.sh and ci/golden-refresh.sh on this CPU machine, for real (issue 36): without a GPU
the nightly stops at once in one line, exit 1, writing nothing (it used to run the whole GPU test
collection to find out); ``--list`` of both scripts prints the same cases, ``CASE GOLDEN``, from the
one list (harness/run/nightly.py), and runs nothing. Rehearsal step: ~10 s of processes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.run.nightly import NIGHTLY_CASES

pytestmark = pytest.mark.rehearsal

ROOT = Path(__file__).parents[2]


def _script(
    name: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "ci" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        check=False,
    )


def test_a_nightly_without_a_gpu_stops_in_one_line_and_writes_nothing(tmp_path):
    out, report = tmp_path / "out", tmp_path / "report"
    child = _script(
        "nightly-gpu.sh", env={"RECOMPUTE_HARNESS_GPU_OUT": str(out), "REPORT_DIR": str(report)}
    )
    assert child.returncode == 1, child.stdout + child.stderr
    assert child.stderr.count("\n") == 1, child.stderr
    assert child.stderr.startswith("nightly: no CUDA device visible on ")
    assert not out.exists() and not report.exists()


def test_both_scripts_list_the_same_cases_with_their_goldens():
    nightly, refresh = _script("nightly-gpu.sh", "--list"), _script("golden-refresh.sh", "--list")
    assert nightly.returncode == refresh.returncode == 0, nightly.stderr + refresh.stderr
    assert nightly.stdout == refresh.stdout
    lines = [line.split(" ") for line in nightly.stdout.splitlines()]
    assert [case for case, _ in lines] == [case.recipe for case in NIGHTLY_CASES]
    # No H100 golden is pinned to this CPU machine's stack: '-' for each (the card's seed golden is
    # pinned to the card's revisions, so the seed study is judged on effects there).
    assert {golden for _, golden in lines} == {"-"}
