"""ci/nightly-gpu.sh and ci/golden-refresh.sh on this CPU machine, for real: a night without a GPU is a
failure in one line before anything runs (issue 24 item 9, issue 36); both scripts list the same cases
from the one list (harness/golden/nightly.py) and run nothing to do so (issue 36, defect 5).
Rehearsal step: ~10 s of processes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.golden.nightly import NIGHTLY_CASES

pytestmark = pytest.mark.rehearsal

ROOT = Path(__file__).parents[2]


def _script(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    out, report = tmp_path / "out", tmp_path / "report"
    return subprocess.run(
        ["bash", str(ROOT / "ci" / argv[0]), *argv[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "RECOMPUTE_HARNESS_GPU_OUT": str(out), "REPORT_DIR": str(report)},
        timeout=600,
        check=False,
    )


def test_a_night_on_a_machine_without_gpus_fails_in_one_line_and_runs_nothing(tmp_path):
    child = _script(tmp_path, "nightly-gpu.sh")
    assert child.returncode == 1, child.stdout + child.stderr
    assert child.stdout == "" and child.stderr.count("\n") == 1, child.stdout + child.stderr
    assert child.stderr.startswith("nightly: no CUDA GPU is visible on this machine")
    assert list(tmp_path.iterdir()) == []  # no sweep, no report: nothing ran


def test_both_scripts_list_the_same_cases_with_their_goldens_and_run_nothing(tmp_path):
    nightly = _script(tmp_path, "nightly-gpu.sh", "--list")
    refresh = _script(tmp_path, "golden-refresh.sh", "--list")
    assert (nightly.returncode, refresh.returncode) == (0, 0), nightly.stderr + refresh.stderr
    assert nightly.stdout == refresh.stdout
    rows = [line.split(" ") for line in nightly.stdout.splitlines()]
    assert [case for case, _ in rows] == [case.recipe for case in NIGHTLY_CASES]
    for case, golden in rows:  # a golden file of the case, or '-' (none for the installed pins)
        assert golden == "-" or (
            golden.startswith(f"{case}__") and (ROOT / "tests" / "golden" / golden).is_file()
        )
    assert list(tmp_path.iterdir()) == []
