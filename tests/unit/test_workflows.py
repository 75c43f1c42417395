"""The GitHub Actions workflows under .github/workflows pass actionlint (the binary the test extra installs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def test_workflows_pass_actionlint():
    # The binary beside this interpreter (the test extra's wheel installs it into the venv's bin/), not
    # PATH's: a bare `.venv/bin/pytest` or an IDE run has no venv on PATH. sys.executable unresolved:
    # a venv's python is a symlink to its base interpreter.
    actionlint = Path(sys.executable).parent / "actionlint"
    assert actionlint.is_file(), (
        f"no {actionlint}: actionlint is part of the test extra (ci/constraints-cpu.txt); "
        "reinstall with ./venv-run"
    )
    result = subprocess.run(
        [str(actionlint), "-color=false"],
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


def test_the_nightly_runs_bridge_and_megatron_core_at_the_projects_pins():
    """Issue 24 item 2: the default NeMo 25.09 image predated Bridge 0.6 (no callbacks module, no
    nemotron_3_nano recipe). The image must be NeMo Framework 26.08 or later (Bridge 0.6's release), and
    the job installs the pins the goldens are keyed on before any test runs."""
    workflow = yaml.safe_load((WORKFLOWS / "nightly-gpu.yml").read_text())
    job = workflow["jobs"]["gpu-tier"]
    default = workflow[True]["workflow_dispatch"]["inputs"]["image"][
        "default"
    ]  # YAML 1.1: on -> True
    assert default.startswith("nvcr.io/nvidia/nemo:")
    year, month = (int(part) for part in default.rsplit(":", 1)[1].split(".")[:2])
    assert (year, month) >= (26, 8), default
    assert default in job["container"]["image"]
    steps = [step.get("run", "") for step in job["steps"]]
    pins = next(i for i, run in enumerate(steps) if "pip install --no-deps" in run)
    assert "optional-dependencies" in steps[pins] and "^megatron-core==" in steps[pins]
    assert pins < next(i for i, run in enumerate(steps) if "ci/nightly-gpu.sh" in run)


def test_the_nightly_installs_what_the_projects_pytest_set_up_loads():
    # addopts passes --dist (pytest-xdist), tests/conftest.py imports hypothesis: without them the GPU
    # tests never collect in the NeMo image, whose project install is --no-deps (issue 36, defect 6).
    steps = yaml.safe_load((WORKFLOWS / "nightly-gpu.yml").read_text())["jobs"]["gpu-tier"]["steps"]
    runs = [step.get("run", "") for step in steps]
    tools = next(i for i, run in enumerate(runs) if "pytest-xdist" in run)
    assert "hypothesis" in runs[tools] and "-c ci/constraints-cpu.txt" in runs[tools]
    assert tools < next(i for i, run in enumerate(runs) if "ci/nightly-gpu.sh" in run)


def test_the_cpu_workflow_runs_every_step_of_ci_run():
    # .ci/run names each step as `step "NAME" COMMAND`; the workflow runs each COMMAND (pytest may add
    # a report option), so a step added to one and not the other fails here.
    ci_steps = re.findall(r'^step "[^"]+" (.+)$', (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    # ruff check, ruff format, mypy, main job, tests, rehearsal, layouts, sweeps, revisions, unreleased,
    # estimates, bridge cpu
    assert len(ci_steps) == 12, ci_steps
    steps = yaml.safe_load((WORKFLOWS / "cpu.yml").read_text())["jobs"]["cpu-tier"]["steps"]
    commands = [step["run"] for step in steps if "run" in step]
    missing = [c for c in ci_steps if not any(run.startswith(c) for run in commands)]
    assert missing == []


def test_a_step_that_collects_one_folder_holds_every_test_of_its_marker():
    # A step may run its marker's tests from one folder (`pytest -m MARKER ... FOLDER`) so its workers
    # do not collect the whole suite: a test of that marker outside the folder would never run.
    ci_steps = re.findall(r'^step "[^"]+" (.+)$', (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    narrowed = {
        match[1]: match[2].split()
        for command in ci_steps
        if (match := re.search(r"pytest -m (\w+) .*?((?: tests/\S+)+)$", command))
    }
    assert "revisions" in narrowed, ci_steps
    for marker, folders in narrowed.items():
        marked = {
            path.relative_to(ROOT).as_posix()
            for path in (ROOT / "tests").rglob("test_*.py")
            if re.search(rf"\bmark\.{marker}\b", path.read_text())
        }
        assert marked, marker
        outside = [path for path in marked if not any(path.startswith(f"{f}/") for f in folders)]
        assert outside == [], f"{marker} tests outside {folders}"
