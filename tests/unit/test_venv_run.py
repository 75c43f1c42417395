"""./venv-run with RECOMPUTE_HARNESS_PYTHON: that interpreter's environment as it is, the harness from this
checkout on PYTHONPATH, nothing installed; a wrong interpreter is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _venv_run(python: str, *command: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "RECOMPUTE_HARNESS_PYTHON": python}
    return subprocess.run([str(ROOT / "venv-run"), *command], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_foreign_interpreter_runs_the_checkout_harness_and_installs_nothing(tmp_path):
    site = Path(subprocess.check_output([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    before = sorted(p.name for p in site.iterdir())
    result = _venv_run(sys.executable, "python", "-c",
                       "import harness, sys; print(harness.__file__); print(sys.executable)")
    assert result.returncode == 0, result.stderr
    harness_file, executable = result.stdout.split()
    assert harness_file == str(ROOT / "harness" / "__init__.py")
    assert executable == sys.executable  # not resolved to the base interpreter: the venv's own packages
    version = _venv_run(sys.executable, "recompute-harness", "--version")
    assert version.returncode == 0 and version.stdout.startswith("recompute-harness ")
    assert sorted(p.name for p in site.iterdir()) == before


@pytest.mark.slow
def test_wrong_interpreters_are_one_line_exit_2(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    cases = {
        str(bare / "bin" / "python"): "lacks torch, megatron-core",
        str(tmp_path / "nowhere" / "python"): "is not an executable",
    }
    if Path("/usr/bin/python3.11").is_file():
        cases["/usr/bin/python3.11"] = "is Python 3.11, not 3.12"
    for python, problem in cases.items():
        result = _venv_run(python, "recompute-harness", "revisions")
        assert result.returncode == 2, (python, result.stderr)
        assert result.stderr.count("\n") == 1 and problem in result.stderr, result.stderr
        assert result.stdout == ""
