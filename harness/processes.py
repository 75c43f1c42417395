"""Child processes in sessions of their own, so that one that hangs is killed with everything it started;
each also dies with the harness (parent-death signal), and a stop signal to the harness unwinds it, so
its clean-ups (killing those children, removing temporary files) run."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM)  # SIGINT already raises KeyboardInterrupt


_stop_requested: int | None = None  # the stop signal received, once one is


def _exit_for(signum: int, frame: object) -> None:
    global _stop_requested
    _stop_requested = signum
    sys.exit(128 + signum)


@contextlib.contextmanager
def stop_signals_as_exit() -> Iterator[None]:
    """Turn SIGTERM (``timeout``, slurm's time limit, CI's cancel) and SIGHUP (a closed terminal) into
    ``SystemExit(128 + signal)``: their default action ends the process on the spot, with no ``finally``
    run, and a probe's isolated child or a row's torchrun would be left running."""
    global _stop_requested
    _stop_requested = None
    previous = {sig: signal.signal(sig, _exit_for) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_if_stopped() -> None:
    """Raise a stop signal's exit again, at the head of each unit of work (a row, a wait on a child).
    The first one can be swallowed: Megatron Core imports its optional fusions under a bare ``except:``,
    and a SIGTERM that lands in such an import left the probe running on, then waiting on its child."""
    if _stop_requested is not None:
        sys.exit(128 + _stop_requested)


def stopped_by(code: object) -> signal.Signals | None:
    """The stop signal a ``stop_signals_as_exit`` exit code stands for, else None."""
    if isinstance(code, int) and code - 128 in {int(sig) for sig in STOP_SIGNALS}:
        return signal.Signals(code - 128)
    return None


def exit_cause(code: object) -> str:
    """What a ``SystemExit`` code says: ``SIGHUP (exit 129)`` for a stop signal, else ``exit N``."""
    sig = stopped_by(code)
    return f"exit {code}" if sig is None else f"{sig.name} (exit {code})"


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of this user's live processes (not this one) whose environment sets ``name=value`` (Linux
    /proc; a zombie's environment reads empty)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid == os.getuid() and needle in (
                entry / "environ"
            ).read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by ``pid`` (a child started with ``start_new_session=True``)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's or a job's CPU set)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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


def run_bounded(
    argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run ``argv`` to completion with its output captured as text; None when it ran past ``timeout_s``
    (its whole process group is then killed)."""
    exit_if_stopped()
    libc_prctl()  # loaded before the fork that runs die_with_parent
    child = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(child.pid)
        child.communicate()
        return None
    except BaseException:  # a stop signal or ^C while waiting: the child goes with us
        kill_group(child.pid)
        child.wait()
        raise
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


# Launch variables of an enclosing torchrun or test: a CPU job's ranks join a group of their own.
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def start_in_own_session(
    argv: Sequence[str], *, stdin: int | None = None, text: bool = False
) -> tuple[subprocess.Popen[Any], IO[str]]:
    """Start ``argv`` with its stdout piped and its stderr in a temporary file (returned, open): in a
    session of its own, so that a hang is killed with its whole group (``kill_group``); dying with
    this process, so that a harness killed outright (SIGKILL, the OOM killer) leaves nothing
    running; without an enclosing torchrun's launch variables. A file, not a pipe, for stderr: a
    chatty child must never block on a full pipe (a false "hang")."""
    env = {key: value for key, value in os.environ.items() if key not in TORCHRUN_VARIABLES}
    stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - the caller reads and closes it
    libc_prctl()  # loaded before the fork that runs die_with_parent
    child = subprocess.Popen(
        list(argv),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=text,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509
    )
    return child, stderr


def run_cpu_torchrun(
    nproc: int, module: str, args: Sequence[str], *, timeout_s: float
) -> tuple[subprocess.CompletedProcess[str] | None, list[str]]:
    """``torchrun --standalone`` of ``module`` on ``nproc`` CPU ranks (gloo), each given ``args`` and
    ``--out DIR``: (the finished job, or None when it ran past ``timeout_s`` and its process tree was
    killed; the texts of the ``rank<r>.json`` files the ranks wrote into DIR, in rank order, read
    before DIR is removed).

    One intra-op thread per rank (the ranks share the cores) and MCore's compiled helpers eager
    (``TORCH_COMPILE_DISABLE``: the byte counts are the same, without Inductor's C++ builds per rank)."""
    env = {**os.environ, "TORCH_COMPILE_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    for key in TORCHRUN_VARIABLES:
        env.pop(key, None)
    with tempfile.TemporaryDirectory(prefix="recompute-torchrun-") as out:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            module,
            *args,
            "--out",
            out,
        ]
        child = run_bounded(command, timeout_s=timeout_s, env=env)
        results = [
            path.read_text()
            for path in sorted(Path(out).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        ]
    return child, results
