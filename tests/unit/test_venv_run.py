"""./venv-run with RECOMPUTE_HARNESS_PYTHON: that interpreter's environment as it is, the harness from this
checkout on PYTHONPATH, nothing installed; a wrong interpreter is one line, exit 2. A new venv on a disk
too full for it is one line, exit 2, before anything is created."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from small_disk import run_on_small_disk

ROOT = Path(__file__).resolve().parents[2]


def _venv_run(python: str, *command: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": tempfile.gettempdir(),
        "RECOMPUTE_HARNESS_PYTHON": python,
    }
    return subprocess.run(
        [str(ROOT / "venv-run"), *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_a_foreign_interpreter_runs_the_checkout_harness_and_installs_nothing(tmp_path):
    site = Path(
        subprocess.check_output(
            [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    before = sorted(p.name for p in site.iterdir())
    result = _venv_run(
        sys.executable,
        "python",
        "-c",
        "import harness, sys; print(harness.__file__); print(sys.executable)",
    )
    assert result.returncode == 0, result.stderr
    harness_file, executable = result.stdout.split()
    assert harness_file == str(ROOT / "harness" / "__init__.py")
    assert (
        executable == sys.executable
    )  # not resolved to the base interpreter: the venv's own packages
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


def test_pytest_in_an_interpreter_without_xdist_or_hypothesis_is_one_line_exit_2(tmp_path):
    # The nightly installs the project with --no-deps into the NeMo image: pyproject's addopts pass
    # --dist (pytest-xdist) and tests/conftest.py imports hypothesis, so pytest stopped before collecting
    # anything (issue 36, defect 6). An interpreter whose packages are this venv's, less those two.
    site = Path(sysconfig_purelib())
    shown = tmp_path / "site"
    shown.mkdir()
    for name in (
        "torch",
        "megatron",
        "rich",
        "matplotlib",
        "packaging",
        "yaml",
        "pytest",
        "_pytest",
    ):
        (shown / name).symlink_to(site / name)
    interpreter = tmp_path / "interpreter"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(interpreter)], check=True, timeout=60
    )
    (Path(sysconfig_purelib(interpreter / "bin" / "python")) / "shown.pth").write_text(f"{shown}\n")
    python = str(interpreter / "bin" / "python")
    refused = _venv_run(python, "pytest", "--version")
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and "lacks pytest-xdist, hypothesis" in refused.stderr
    # A command that runs no tests needs neither.
    assert _venv_run(python, "python", "-c", "pass").returncode == 0


def sysconfig_purelib(python: Path | str = sys.executable) -> str:
    return subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()


def test_a_new_venv_on_a_nearly_full_disk_is_refused_in_one_line_and_creates_nothing(tmp_path):
    """The CI machine once had 5 GB free: pip died mid-install with a traceback. A 32 MiB disk stands in
    for it; the checkout's set-up files are copied onto it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    files = ("venv-run", "pyproject.toml", ".python-version", "ci/constraints-cpu.txt")
    copies = "\n".join(
        f'mkdir -p "$DISK/{Path(f).parent}" && cp -p {ROOT / f} "$DISK/{f}"' for f in files
    )
    result = run_on_small_disk(
        disk,
        copies + '\n"$DISK/venv-run" true; echo rc=$?; ls -A "$DISK"',
        size_mib=32,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    lines = result.stdout.splitlines()
    assert "rc=2" in lines, result
    refusal = [line for line in result.stderr.splitlines() if line.startswith("venv-run:")]
    assert len(refusal) == 1 and "needs about 7 GiB free" in refusal[0], result.stderr
    assert int(re.search(r"which has (\d+) MiB", refusal[0]).group(1)) <= 32
    assert ".venv" not in lines[lines.index("rc=2") + 1 :]  # nothing created on the full disk


def test_tests_without_venv_run_use_its_torch_extensions_dir():
    # venv-run pre-builds share_storage_ext in $venv/torch-extensions; the tests' conftest must name the
    # same folder when pytest starts without venv-run (no TORCH_EXTENSIONS_DIR in the environment).
    assert (
        'TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$venv/torch-extensions}"'
        in (ROOT / "venv-run").read_text()
    )
    if sys.prefix == sys.base_prefix:
        pytest.skip("not in a venv (RECOMPUTE_HARNESS_PYTHON): torch's own default applies")
    env = {key: value for key, value in os.environ.items() if key != "TORCH_EXTENSIONS_DIR"}
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import os, runpy, sys; runpy.run_path(sys.argv[1]); "
                "print(os.environ['TORCH_EXTENSIONS_DIR'])"
            ),
            str(ROOT / "tests" / "conftest.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert shown.stdout.strip() == str(Path(sys.prefix) / "torch-extensions")
