"""Child processes in sessions of their own, so that one that hangs is killed with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by ``pid`` (a child started with ``start_new_session=True``)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def run_bounded(argv: Sequence[str], *, timeout_s: float,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str] | None:
    """Run ``argv`` to completion with its output captured as text; None when it ran past ``timeout_s``
    (its whole process group is then killed)."""
    child = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=None if env is None else dict(env), start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(child.pid)
        child.communicate()
        return None
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
