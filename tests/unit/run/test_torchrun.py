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
