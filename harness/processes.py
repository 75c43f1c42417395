"""Child processes in sessions of their own, so that one that hangs is killed with everything it started."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by ``pid`` (a child started with ``start_new_session=True``)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux prctl).

    Survives ``exec``: used as a ``preexec_fn`` for torchrun and called by every worker, so a runner
    that is SIGKILLed (no chance to clean up) takes its agents, and they their workers, with it. If the
    parent is already gone (re-parented to init before the call took effect), exit at once."""
    parent = os.getppid()
    prctl = libc_prctl()
    if prctl is None:  # not Linux: the runner's token sweep remains the only cleanup
        return
    prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


@functools.cache
def libc_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, loaded once in the parent (a ``preexec_fn`` must not load libraries after fork)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


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
