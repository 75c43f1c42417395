"""ci/gpu-check-h200.sh rehearsed on CPU: the same steps as on the H200 (requirements, revisions, sweep,
golden, overhead) on a CPU recipe, and what comes back fits the device's limits (<= 8 files, <= 2
folders deep under $OUT). A step that fails still lets every other step report."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.rehearsal

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "ci" / "gpu-check-h200.sh"


def _rehearse(out: Path, **env: str) -> tuple[int, list[str]]:
    child = subprocess.run(
        ["bash", str(SCRIPT), "--rehearse-on-cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OUT": str(out), **env},
        timeout=900,
        check=False,
    )
    files = [path for path in out.rglob("*") if path.is_file()]
    assert len(files) <= 8 and all(len(path.relative_to(out).parts) <= 3 for path in files), files
    return child.returncode, (out / "summary.txt").read_text().splitlines()


def test_the_rehearsal_runs_every_step_and_packs_what_it_measured(tmp_path):
    rc, summary = _rehearse(tmp_path)
    assert rc == 0, "\n".join(summary)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gpu-check.tar.gz", "summary.txt"]
    for step in ("revisions", "share-storage-ext", "sweep", "overhead"):
        assert f"{step}: ok" in summary
    # CPU records never become timing goldens: the golden step checks that the harness refuses them.
    assert (
        "golden: ok (refused on CPU records, as it must be; a GPU run writes the golden)" in summary
    )
    assert "requirements: ok" in summary and summary[-1] == "exit status 0"
    assert any(line.startswith("row mla_up_proj: completed on cpu") for line in summary)
    with tarfile.open(tmp_path / "gpu-check.tar.gz") as archive:
        names = archive.getnames()
    assert sum(n.endswith(".json") and "/records/" in n for n in names) == 2
    assert {"./gpu-check.log", "./revisions.txt", "./instrumentation-overhead.json"} <= set(names)
    assert not any(n.startswith("./golden/") and n.endswith(".json") for n in names)


def test_a_failing_step_does_not_stop_the_others_from_reporting(tmp_path):
    # The sweep runs out of its wall-clock limit before any row finishes: no records, no golden.
    rc, summary = _rehearse(tmp_path, GPU_CHECK_SWEEP_LIMIT_S="1")
    assert rc == 1
    assert "revisions: ok" in summary
    assert any(line.startswith("sweep: failed (exit 124)") for line in summary), summary
    assert "golden: skipped (the sweep wrote no records)" in summary
    assert "overhead: ok" in summary
    assert (tmp_path / "gpu-check.tar.gz").exists() and summary[-1] == "exit status 1"


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="a CUDA GPU is visible: nothing is missing"
)
def test_missing_requirements_are_named_on_one_line(tmp_path):
    child = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "gpu_check_requirements.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = child.stdout.splitlines()
    assert child.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("requirements: missing: ") and "a CUDA GPU" in lines[0]
