"""The bump workflow rehearsed in a temporary copy of this repository, a Megatron Core tree (an overlay,
``overlays.py``) shadowing the venv's: what tests/unit/commands/test_bump*.py and
benchmarks/bump_rehearsal.py run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from overlays import WHOLE_PROBE_TIMEOUT_S

REPO = Path(__file__).resolve().parents[2]


def copy_repo(tmp_path: Path) -> Path:
    """The tracked (and not ignored) files of the repository, as a checkout would have them."""
    listed = (
        subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    copy = tmp_path / "repo"
    for relative in filter(None, listed):
        source = REPO / relative
        if source.is_file():
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / relative)
    return copy


def goldens(repo: Path) -> dict[str, bytes]:
    return {
        path.relative_to(repo).as_posix(): path.read_bytes()
        for path in (repo / "tests" / "golden").rglob("*")
        if path.is_file()
    }


def refresh(repo: Path, mcore: Path, *, jobs: int | None = None) -> subprocess.CompletedProcess:
    """The bump workflow (``ci/golden-refresh.sh --cpu-only``) in ``repo`` with ``mcore`` shadowing the
    venv's Megatron Core (its probe's passes on ``jobs`` workers, default one per core)."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{repo}{os.pathsep}{mcore}",
        "RECOMPUTE_HARNESS_PYTHON": sys.executable,
    }
    env.pop("VIRTUAL_ENV", None)
    command = [
        str(repo / "ci" / "golden-refresh.sh"),
        "--cpu-only",
        *([f"--jobs={jobs}"] if jobs else []),
    ]
    return subprocess.run(
        command,
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=WHOLE_PROBE_TIMEOUT_S,
        check=False,
    )
