"""ci/nightly-gpu.sh on this CPU machine, for real (issue 24 item 9): every GPU test skips here, which a
nightly must report as a failure in one line, not as a green night; a partial or fault sweep under
scratch/ is kept but never compared with a golden (item 10). Rehearsal step: ~15 s of processes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from record_samples import run_record, write_sweep

pytestmark = pytest.mark.rehearsal

ROOT = Path(__file__).parents[2]


def test_a_nightly_in_which_no_gpu_test_ran_fails_saying_why(tmp_path):
    out, report = tmp_path / "out", tmp_path / "report"
    write_sweep(out / "scratch" / "tiny-recipe-partial", {"[]": run_record()})
    child = subprocess.run(
        ["bash", str(ROOT / "ci" / "nightly-gpu.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "RECOMPUTE_HARNESS_GPU_OUT": str(out), "REPORT_DIR": str(report)},
        timeout=600,
        check=False,
    )
    said = [line for line in child.stderr.splitlines() if line.startswith("nightly: ")]
    assert child.returncode == 1, child.stdout + child.stderr
    assert len(said) == 1 and re.fullmatch(
        r"nightly: no GPU test ran \((\d+) collected, \1 skipped: needs .+\)", said[0]
    ), said
    summary = (report / "summary.md").read_text()
    assert summary.splitlines() == said  # the report says it too; the scratch sweep is not compared
    assert (report / "gpu-tests.xml").exists()
