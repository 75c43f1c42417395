"""A runner ended with SIGTERM (``timeout``, slurm's time limit) stops the row's launch, leaving nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

from harness.processes import processes_with_env

MARKER_ENV = "RECOMPUTE_HARNESS_TEST_MARKER"


def test_sigterm_to_the_runner_stops_the_launched_process_group(tmp_path):
    marker = uuid.uuid4().hex
    script = (
        "import sys\nfrom pathlib import Path\nfrom harness.processes import stop_signals_as_exit\nfrom harness.run.torchrun import run_row\n"
        "with stop_signals_as_exit():\n"
        f"    run_row(Path({str(tmp_path)!r}), [['sleep', '300']], world_size=1, timeout_s=300, stall_timeout_s=300)\n"
    )
    runner = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, MARKER_ENV: marker}
    )
    try:
        deadline = time.monotonic() + 30
        while (
            len(processes_with_env(MARKER_ENV, marker)) < 2 and time.monotonic() < deadline
        ):  # the runner and its `sleep`
            time.sleep(0.1)
        assert len(processes_with_env(MARKER_ENV, marker)) == 2
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == 128 + signal.SIGTERM
        assert processes_with_env(MARKER_ENV, marker) == []
    finally:
        for pid in processes_with_env(MARKER_ENV, marker):
            os.kill(pid, signal.SIGKILL)


# Issue 24 item 11: the `exit:` fault test once failed under load because a worker the sweep had just
# SIGKILLed was still in /proc when the row's record was read; the sweep now waits for its kills.
def test_the_sweep_returns_only_once_the_processes_it_killed_are_gone():
    from harness.run.torchrun import JOB_TOKEN_ENV, _process_gone, _sweep

    token = uuid.uuid4().hex
    # Each `sleep` in a session of its own, like a worker that outlived torchrun (not our child).
    spawner = subprocess.run(
        [
            "bash",
            "-c",
            "for i in $(seq 24); do setsid sleep 300 >/dev/null 2>&1 & done; echo $(jobs -p)",
        ],
        env={**os.environ, JOB_TOKEN_ENV: token},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert spawner.stdout.split()
    deadline = time.monotonic() + 30
    while len(processes_with_env(JOB_TOKEN_ENV, token)) < 24 and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = _sweep(token)
    try:
        assert len(killed) == 24
        assert [pid for pid in killed if not _process_gone(pid)] == []
    finally:
        for pid in processes_with_env(JOB_TOKEN_ENV, token):
            os.kill(pid, signal.SIGKILL)


# Issue 24 item 8: a rank that writes its first phase and then compiles in silence (Nemotron: Triton
# autotune and HybridEP's JIT inside iteration 1), through the workers' own event writer.
SLOW_FIRST_ITERATION = """
import os, sys, time
from pathlib import Path
from harness.run.events import EventWriter
writer = EventWriter(Path(sys.argv[1]), 0)
writer.emit("start", rank=0, world_size=1, pid=os.getpid(), host=os.uname().nodename, device="cpu")
writer.emit("phase", iteration=1, phase="forward")
time.sleep(float(sys.argv[2]))
writer.emit("iteration", iteration=1, loss=1.0, step_time_ms=1.0, skipped=False, nan=False)
writer.emit("phase", iteration=2, phase="forward")
writer.emit("iteration", iteration=2, loss=1.0, step_time_ms=1.0, skipped=False, nan=False)
writer.emit("done")
"""


def _slow_first_iteration(tmp_path, silence_s, first_iteration_timeout_s):
    from harness.run.torchrun import run_row

    command = [sys.executable, "-c", SLOW_FIRST_ITERATION, str(tmp_path), str(silence_s)]
    return run_row(
        tmp_path,
        [command],
        world_size=1,
        timeout_s=60,
        stall_timeout_s=1.0,
        first_iteration_timeout_s=first_iteration_timeout_s,
    )


def test_a_first_iteration_slower_than_the_stall_timeout_is_no_hang(tmp_path):
    launch = _slow_first_iteration(tmp_path, 3.0, first_iteration_timeout_s=30.0)
    assert (launch.stopped, launch.returncodes) == (None, [0])


def test_a_first_iteration_past_its_allowance_is_a_stall_at_that_allowance(tmp_path):
    launch = _slow_first_iteration(tmp_path, 60.0, first_iteration_timeout_s=2.0)
    assert (launch.stopped, launch.stall_limit_s) == ("stall", 2.0)
    assert launch.elapsed_s < 30
