"""A probe that deadlocks is reported as a hang and its process group is killed; nothing waits on it. A
probe that is stopped (SIGTERM) or killed (SIGKILL) takes its isolated children with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from marked_processes import MARKER_ENV, marked_processes

from harness.config.fields import RecomputeFields
from harness.probe.plan import ProbeRow
from harness.probe.workers.isolate import IsolatedProbe
from harness.processes import libc_prctl

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


@pytest.mark.parametrize(
    ("runaway_threads", "timeout_s", "message"),
    [
        # The deadlock's reentrant backward keeps starting threads: seen long before the timeout
        # (a minute here, so a loaded machine's slow thread growth is not taken over by it).
        (
            4,
            60,
            (
                "reentrant backward without end: over 4 threads started into measurement "
                "(a measurement starts none); process group killed"
            ),
        ),
        # Without the thread watch (a deadlock that starts no threads), the timeout ends it.
        (None, 3, "no result 3 s into measurement; process group killed"),
    ],
)
def test_selective_mlp_with_biases_is_reported_as_hang(runaway_threads, timeout_s, message):
    # MCore 0.19.2 deadlocks in CheckpointFunction.backward for selective `mlp` with biases. When an
    # upstream fix lands this test fails: the row then completes, and the probe reports it measured.
    # The child's start-up (torch + MCore import) has its own, generous limit: a loaded CI box is slow.
    probe = IsolatedProbe(
        "dense-tiny",
        ProbeRow(RecomputeFields.selective("mlp"), add_bias_linear=True),
        timeout_s=timeout_s,
        runaway_threads=runaway_threads,
    )
    # The deadline is kept while the parent is busy elsewhere (measuring the other rows), not when it
    # collects the outcome: the deadlock spins a core until it is killed.
    assert _wait_for(lambda: probe.process.poll() is not None, 120)
    outcome = probe.outcome()
    assert (outcome.status, outcome.message) == ("hang", message)
    try:
        os.killpg(probe.process.pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


def test_a_row_that_ends_is_not_taken_for_a_runaway():
    # The same row without biases finishes under the same thread watch: its backward starts no threads.
    probe = IsolatedProbe(
        "dense-tiny", ProbeRow(RecomputeFields.selective("mlp")), timeout_s=60, runaway_threads=4
    )
    outcome = probe.outcome()
    assert outcome.status == "completed" and outcome.payload is not None, outcome.message
    assert outcome.payload["status"] == "effective"


def _isolated_children(marker: str) -> list[int]:
    """Live processes of this test (its marker in their environment) running the isolated child."""
    return marked_processes(marker, "harness.probe.workers.isolated_child")


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def _watch(parent: subprocess.Popen, marker: str) -> None:
    """Wait for ``parent``'s isolated child to start; fail with the parent's words if it never does."""
    assert _wait_for(lambda: _isolated_children(marker) or parent.poll() is not None, 120), (
        "nothing started"
    )
    assert parent.stderr is not None  # started with stderr=PIPE
    assert _isolated_children(marker), f"the isolated child never started: {parent.stderr.read()}"


# Four processes import torch and Megatron Core (the probe, its two pass workers, the isolated
# child): ~30 s of the tier's 150 s, so .ci/run's sweeps step with the other interrupt tests.
@pytest.mark.slow
@pytest.mark.sweeps
def test_a_sigtermed_probe_unwinds_and_takes_its_isolated_child_with_it():
    # The child deadlocks (selective mlp with biases) and spins a core until its own lifetime (~5 min) ends:
    # before the fix, a SIGTERMed `probe` left it running. The deadlock probe is part of dense-tiny's full
    # plan; its child starts before the in-process rows.
    marker = uuid.uuid4().hex
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "probe",
            "--model",
            "dense-tiny",
            "--hang-timeout",
            "300",
        ],
        env={**os.environ, MARKER_ENV: marker},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _watch(parent, marker)
        parent.send_signal(signal.SIGTERM)
        assert (
            parent.wait(timeout=60) == 143
        )  # unwound: its clean-up ran, and it says why it stopped
        assert (
            parent.stderr.read().strip().splitlines()[-1]
            == "recompute-harness: stopped by SIGTERM (exit 143)"
        )
        assert _wait_for(lambda: not _isolated_children(marker), 10), _isolated_children(marker)
    finally:
        parent.kill()
        for pid in _isolated_children(marker):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _adopting_orphans():
    """Make this process the subreaper of its descendants: an orphaned grandchild becomes our child,
    so its exit status (how it died, not only when) can be read with waitpid."""
    prctl = libc_prctl()
    assert prctl is not None, "the parent-death signal under test is Linux prctl"
    assert prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _exit_status(pid: int, timeout_s: float) -> int | None:
    """``pid``'s wait status once it has ended (it must be our child), None if it is still running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reaped, status = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return status
        time.sleep(0.05)
    return None


def test_a_sigkilled_parents_isolated_child_dies_with_it():
    # A parent that only starts the child (no torch of its own) and is then SIGKILLed: no clean-up runs.
    # No thread watch: its kill (SIGKILL too) must not be taken for the parent-death signal's.
    marker = uuid.uuid4().hex
    script = (
        "import time\nfrom harness.config.fields import RecomputeFields\nfrom harness.probe.workers.isolate import IsolatedProbe\n"
        "from harness.probe.plan import ProbeRow\n"
        "IsolatedProbe('dense-tiny', ProbeRow(RecomputeFields.selective('mlp'), add_bias_linear=True), timeout_s=300, runaway_threads=None)\n"
        "time.sleep(300)\n"
    )
    with _adopting_orphans():
        parent = subprocess.Popen(
            [sys.executable, "-c", script],
            env={**os.environ, MARKER_ENV: marker},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _watch(parent, marker)
            (child,) = _isolated_children(marker)
            parent.kill()
            parent.wait(timeout=10)
            # The orphan is now ours: how it ended says what ended it, however loaded the machine.
            # SIGKILL is the parent-death signal; an orphan that outlived its parent would end later of
            # a broken pipe once its set-up printed READY (an exit status), or of its 300 s lifetime.
            status = _exit_status(child, timeout_s=120)
            assert status is not None, "the orphaned child still runs 120 s after its parent died"
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                f"the child ended with wait status {status:#x}, not by the parent-death SIGKILL"
            )
        finally:
            parent.kill()
            for pid in _isolated_children(marker):
                os.kill(pid, signal.SIGKILL)
