"""One torchrun job per row: build the ``torch.distributed.run`` command, run it, stop it when it hangs.

torchrun is started as a subprocess in a session (process group) of its own, with every rank's
stdout/stderr and its ``error.json`` (``TORCHELASTIC_ERROR_FILE``) under ``ROW_DIR/torchrun/``. A row
is stopped when it runs past its timeout, or when, once every rank is training, no rank has
reported anything for the stall timeout (a hung rank leaves the others blocked in a collective:
that is a hang, not a slow step). Stopping sends SIGTERM to torchrun's group (torchrun then
terminates its workers), then SIGKILL; as a last resort every process that still carries this row's
job token in its environment is killed by pid. Several "nodes" on one host (a multi-node rendezvous
on localhost) are several torchrun processes joined by a c10d rendezvous on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.processes import (
    die_with_parent,
    exit_if_stopped,
    kill_group,
    libc_prctl,
    processes_with_env,
)
from harness.run.environment import launch_environment
from harness.run.events import RankEvidence, latest_activity, read_row

JOB_TOKEN_ENV = "RECOMPUTE_HARNESS_JOB"
TORCHRUN_DIR = "torchrun"
POLL_S = 0.5
TERM_GRACE_S = 10.0
# How long a node's torchrun gets, once the runner saw a rank of it die, to end on its own: its agent
# stops the rank's peers and names the first failure it observed (exit code, signal) in its summary.
# Between two polls the agent may already have stopped a peer, which then looks dead too.
DIED_SUMMARY_S = 5.0
# How long the sweep waits for the workers it SIGKILLed to be gone (their exit is not instant).
SWEEP_WAIT_S = 10.0


@dataclass
class LaunchResult:
    returncodes: list[int | None]
    elapsed_s: float
    token: str  # the job token every process of the row carries (see processes_with_token)
    stopped: str | None = None  # "timeout" | "stall" | "died" | None
    killed_leftovers: list[int] = field(default_factory=list)
    died: list[int] = field(
        default_factory=list
    )  # ranks whose process ended without finishing or an error
    stall_limit_s: float | None = (
        None  # the silence allowed when stopped "stall" (first-iteration or stall)
    )

    @property
    def succeeded(self) -> bool:
        return self.stopped is None and all(code == 0 for code in self.returncodes)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun_args(nnodes: int, nproc_per_node: int, endpoint: str, rdzv_id: str) -> list[str]:
    return [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--max-restarts",
        "0",
        "--redirects",
        "3",
    ]


def local_commands(
    row_dir: Path, nnodes: int, nproc_per_node: int, rdzv_id: str, python: str = sys.executable
) -> list[list[str]]:
    """One torchrun per node, all on this host (c10d rendezvous on 127.0.0.1; node 0 hosts the store)."""
    endpoint = f"127.0.0.1:{free_port()}"
    return [
        [
            python,
            *_torchrun_args(nnodes, nproc_per_node, endpoint, rdzv_id),
            "--node-rank",
            str(node),
            "--rdzv-conf",
            f"is_host={str(node == 0).lower()}",
            "--log-dir",
            str(Path(row_dir) / TORCHRUN_DIR / f"node{node}"),
            "-m",
            "harness.run.worker",
            str(row_dir),
        ]
        for node in range(nnodes)
    ]


def slurm_command(
    row_dir: Path,
    nnodes: int,
    nproc_per_node: int,
    rdzv_id: str,
    head: str,
    port: int,
    python: str = "python",
    srun_args: Sequence[str] = (),
) -> list[str]:
    """One ``srun`` step, one task per node, each running torchrun; the c10d store lives on ``head``."""
    torchrun = " ".join(
        [
            python,
            *_torchrun_args(nnodes, nproc_per_node, f"{head}:{port}", rdzv_id),
            "--log-dir",
            f"{row_dir}/{TORCHRUN_DIR}/node$SLURM_NODEID",
            "-m",
            "harness.run.worker",
            str(row_dir),
        ]
    )
    return [
        "srun",
        f"--nodes={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        *srun_args,
        "bash",
        "-c",
        f"exec {torchrun}",
    ]


def processes_with_token(token: str) -> list[int]:
    """Pids of this user's processes whose environment carries the row's job ``token``."""
    return processes_with_env(JOB_TOKEN_ENV, token)


def _stop(procs: list[subprocess.Popen], token: str, grace_s: float = TERM_GRACE_S) -> list[int]:
    for proc in procs:
        kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            kill_group(proc.pid)
        proc.wait()
    return _sweep(token)


def _sweep(token: str) -> list[int]:
    """Workers run in sessions of their own: kill, by pid, any that outlived torchrun, and wait until
    they are gone (bounded): a SIGKILLed rank tearing down a large address space stays listed for a
    while on a loaded machine, and the row is over only once none runs."""
    leftovers = processes_with_token(token)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + SWEEP_WAIT_S
    while leftovers and processes_with_token(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return leftovers


def run_row(
    row_dir: Path,
    commands: list[list[str]],
    *,
    world_size: int,
    timeout_s: float,
    stall_timeout_s: float,
    env: dict[str, str] | None = None,
    on_poll: Callable[[list[RankEvidence], float], None] | None = None,
    first_iteration_timeout_s: float | None = None,
    declared: Mapping[str, str] | None = None,
) -> LaunchResult:
    """Start each command (a torchrun, or an srun of torchruns) in its own session, watch the ranks'
    evidence, and stop the job on timeout or stall. Until every rank has finished iteration 1 the
    silence allowed is ``first_iteration_timeout_s`` (None: the stall timeout): a first step compiles
    (Triton autotune, HybridEP's JIT, TE's kernels) for minutes without a word, which is no hang.
    ``declared``: the row's recorded variables (``harness.run.environment``), exactly; without it the
    row inherits them from this process."""
    row_dir = Path(row_dir)
    token = uuid.uuid4().hex
    base = {**os.environ, **(env or {})}
    if declared is not None:
        base = launch_environment(base, declared)
    child_env = {**base, JOB_TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    wall_start = time.time()
    procs: list[subprocess.Popen] = []
    stopped = None
    limit = stall_timeout_s
    libc_prctl()  # loaded before the fork that runs die_with_parent
    try:  # started inside: a launch that fails part-way still stops the nodes already started
        for index, command in enumerate(commands):
            with open(row_dir / f"launcher{index}.log", "w", encoding="utf-8") as log:
                procs.append(
                    subprocess.Popen(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=child_env,
                        start_new_session=True,
                        preexec_fn=die_with_parent,  # noqa: PLW1509
                    )
                )
        while any(proc.poll() is None for proc in procs):
            exit_if_stopped()
            time.sleep(POLL_S)
            elapsed = time.monotonic() - started
            ranks = read_row(row_dir, world_size)
            if on_poll is not None:
                on_poll(ranks, elapsed)
            # The stall clock runs once every rank is training (iteration >= 1): imports, rendezvous
            # and model build are bounded by the row timeout (and torchrun's own join timeout).
            watching = all(rank.started and rank.iteration >= 1 for rank in ranks)
            past_first = all(rank.iterations for rank in ranks)
            limit = (
                stall_timeout_s
                if past_first or first_iteration_timeout_s is None
                else first_iteration_timeout_s
            )
            died = _died_unreported(row_dir, world_size, ranks)
            if died:  # blame and stop now: the others would only wait in a collective for the stall timeout
                stopped = "died"
            elif elapsed > timeout_s:
                stopped = "timeout"
            elif watching and time.time() - (latest_activity(ranks) or wall_start) > limit:
                stopped = "stall"
            if stopped:
                break
        if stopped == "died":
            _await_nodes_of(procs, died, world_size)
    except BaseException:
        _stop(procs, token)
        raise
    # A row with a dead rank is lost already: its peers get no grace to wait in a collective for it.
    killed = (
        _stop(procs, token, 0.0 if stopped == "died" else TERM_GRACE_S)
        if stopped
        else _sweep(token)
    )
    return LaunchResult(
        [proc.returncode for proc in procs],
        time.monotonic() - started,
        token,
        stopped,
        killed,
        died if stopped == "died" else [],
        limit if stopped == "stall" else None,
    )


def _await_nodes_of(procs: list[subprocess.Popen], ranks: list[int], world_size: int) -> None:
    """Wait (at most ``DIED_SUMMARY_S``) for the launchers of ``ranks`` to end by themselves (one
    launcher per node, or one srun for all of them)."""
    ranks_per_launcher = max(world_size // len(procs), 1)
    launchers = {min(rank // ranks_per_launcher, len(procs) - 1) for rank in ranks}
    deadline = time.monotonic() + DIED_SUMMARY_S
    waiting = [procs[index] for index in sorted(launchers)]
    while any(proc.poll() is None for proc in waiting) and time.monotonic() < deadline:
        exit_if_stopped()
        time.sleep(0.05)


def _process_gone(pid: int) -> bool:
    """Ended (or a zombie its torchrun has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _died_unreported(row_dir: Path, world_size: int, ranks: list[RankEvidence]) -> list[int]:
    """Ranks on this host whose worker process is gone without a ``done`` or an ``error`` line (a
    SIGKILL, an early exit). Processes are checked before the evidence is read again, so a rank that
    wrote ``done`` and then exited is never counted."""
    host = socket.gethostname()
    gone = [
        rank.rank
        for rank in ranks
        if rank.started
        and not rank.done
        and not rank.errors
        and rank.pid is not None
        and rank.host == host
        and _process_gone(rank.pid)
    ]
    if not gone:
        return []
    fresh = read_row(row_dir, world_size)
    return [rank for rank in gone if not fresh[rank].done and not fresh[rank].errors]
