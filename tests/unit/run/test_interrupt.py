"""The runner owns its children: a stop signal records the running row as ``interrupted`` and stops
its process tree; a SIGKILLed runner's workers die with it (parent-death signal) and its sweep reads as incomplete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.record.io import load_records, unmeasured_rows
from harness.run.events import read_rank

# Two-rank torchrun sweeps, one per case: .ci/run's "sweeps" step, outside the tier's 150 s.
pytestmark = [pytest.mark.slow, pytest.mark.sweeps]


def _start_sweep(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--recipe",
            "cpu-moonlight-ep2",
            "--rows",
            "[]",
            "--out",
            str(out),
            "--stall-timeout",
            "120",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _training_pids(out: Path, runner: subprocess.Popen) -> list[int]:
    """Wait until both ranks report iteration 1; their worker pids."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and runner.poll() is None:
        events = sorted(out.glob("*/rows/control/events/rank*.jsonl"))
        ranks = [read_rank(path, i) for i, path in enumerate(events)]
        pids = [rank.pid for rank in ranks if rank.iterations and rank.pid is not None]
        if len(ranks) == 2 and len(pids) == 2:
            return pids
        time.sleep(0.2)
    assert runner.stderr is not None  # started with stderr=PIPE
    pytest.fail(
        f"the sweep never trained: {runner.stderr.read().decode() if runner.poll() is not None else 'timeout'}"
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_sighup_records_the_running_row_as_interrupted_and_stops_its_processes(tmp_path):
    runner = _start_sweep(tmp_path)
    pids = _training_pids(tmp_path, runner)
    runner.send_signal(signal.SIGHUP)
    assert runner.wait(timeout=60) != 0
    assert not any(_alive(pid) for pid in pids)
    (sweep,) = tmp_path.iterdir()
    (record,) = load_records([sweep / "records"])
    assert (
        record.outcome.status == "interrupted"
        and record.outcome.iteration >= 1
        and record.outcome.ranks
    )
    marker = json.loads((sweep / "INTERRUPTED.json").read_text())
    assert marker["row"] == "[]" and marker["reason"] == "SIGHUP (exit 129)"
    assert "stopped by SIGHUP (exit 129)" in record.outcome.message


def test_a_sigkilled_runners_workers_exit_within_seconds(tmp_path):
    runner = _start_sweep(tmp_path)
    pids = _training_pids(tmp_path, runner)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    leftover = [pid for pid in pids if _alive(pid)]
    for pid in leftover:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert leftover == []
    # No marker could be written, but the plan tells every reader that the sweep is incomplete.
    (sweep,) = tmp_path.iterdir()
    assert unmeasured_rows([tmp_path]) == [
        (
            f"{sweep}: incomplete sweep: no record for row(s) [] of the 1 planned "
            "(its runner was stopped, killed or could not write)"
        )
    ]
