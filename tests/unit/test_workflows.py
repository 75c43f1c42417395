"""The GitHub Actions workflows under .github/workflows pass actionlint (the binary the test extra installs)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def test_workflows_pass_actionlint():
    actionlint = shutil.which("actionlint")
    assert actionlint, (
        "actionlint is part of the test extra (ci/constraints-cpu.txt): reinstall with ./venv-run"
    )
    result = subprocess.run(
        [actionlint, "-color=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cpu_workflow_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    steps = yaml.safe_load((WORKFLOWS / "cpu.yml").read_text())["jobs"]["cpu-tier"]["steps"]
    commands = [step["run"] for step in steps if "run" in step]
    assert "./venv-run recompute-harness probe --all --check-golden" in commands
    assert any(c.startswith('./venv-run pytest -m "not gpu" -n auto') for c in commands)
    assert './venv-run pytest -m "not gpu" -n auto' in readme
    assert {p.name for p in WORKFLOWS.glob("*.yml")} == {
        "cpu.yml",
        "nightly-gpu.yml",
        "golden-refresh.yml",
    }
