"""Run a probe row that may hang in its own process group, under a timeout.

The child (``python -m harness.probe.workers.isolated_child``) sets up gloo + the model, prints ``READY``, measures,
and prints one ``RESULT {json}`` line. The parent gives the setup ``startup_timeout_s`` and the
measurement ``timeout_s`` after ``READY``; past either, the whole process group is killed (SIGKILL)
and the row is reported as a hang. The parent never blocks the rest of the probe matrix: it starts
the child first and collects it last.

A hang need not wait for the timeout when the child can see it: the known deadlock (selective ``mlp``
with biases) is a reentrant backward that re-enters itself without end, and autograd hands every
60 levels of reentrant backward to a new thread, so the child's thread count grows for as long as it
runs (measured on dense-tiny: 3 threads at ``READY``, +4 about 1.5 s later, 85 after 10 s), where a
measurement starts none. Past ``runaway_threads`` new threads the child prints ``RUNAWAY <n>`` and the
parent kills its group at once (a 10 s spin of one core saved per whole probe); a deadlock that starts
no threads still ends at the timeout. The count is read from ``/proc/self/task``; elsewhere only the
timeout applies.

The deadlines are kept by a watcher thread from the start, not when the outcome is collected: the
known deadlock spins a core (and keeps starting threads) until it is killed, so a child collected
after a whole multi-model probe had spun for all of it, half of a 2-core machine (measured: a
``diff`` side's tree probe, 150 s of wall, took 255 s of CPU; the child's share was ~100 s).
"""

from __future__ import annotations

import json
import selectors
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from harness.probe.measurement.status import CRASH, HANG
from harness.probe.plan import ProbeRow
from harness.processes import exit_if_stopped, kill_group, start_in_own_session

READY, RESULT, RUNAWAY = "READY", "RESULT ", "RUNAWAY "
DEFAULT_HANG_TIMEOUT_S = 10.0  # the measurement's limit after READY (`probe --hang-timeout`)
# New threads (over those alive at READY) that mark a reentrant backward without end: each stands for
# 60 levels of reentrant nesting, where a checkpointed model nests a few.
RUNAWAY_THREADS = 4


@dataclass
class IsolatedOutcome:
    """``hang`` (killed after the timeout), ``crash`` (child failed) or ``completed`` with a payload."""

    status: str
    message: str
    payload: dict[str, Any] | None = None


class IsolatedProbe:
    """A started child process measuring one row; ``outcome()`` waits for it (bounded)."""

    def __init__(
        self,
        model: str,
        row: ProbeRow,
        *,
        timeout_s: float,
        startup_timeout_s: float = 300.0,
        runaway_threads: int | None = RUNAWAY_THREADS,
        seed: int = 1234,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        attention_backend: str = "unfused",
    ) -> None:
        self.model = model
        self.row = row
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.runaway_threads = runaway_threads
        # The child also ends itself past its whole budget (on machines without a parent-death signal).
        lifetime_s = startup_timeout_s + timeout_s + 30
        command = [
            sys.executable,
            "-m",
            "harness.probe.workers.isolated_child",
            "--model",
            model,
            "--seed",
            str(seed),
            "--fields",
            json.dumps(row.fields.as_dict()),
            "--lifetime",
            str(lifetime_s),
            "--attention-backend",
            attention_backend,
            "--runaway-threads",
            str(runaway_threads or 0),
        ]
        if row.add_bias_linear:
            command.append("--add-bias-linear")
        for flag, value in (("--seq-length", seq_length), ("--micro-batch-size", micro_batch_size)):
            if value is not None:
                command += [flag, str(value)]
        self.started = time.monotonic()
        # A hang is killed with its group, and a parent killed outright leaves no spinning deadlock.
        self.process, self.stderr = start_in_own_session(command, text=True)
        self._outcome: IsolatedOutcome | None = None
        self._watcher = threading.Thread(
            target=self._watch, name=f"isolated probe of {model}", daemon=True
        )
        self._watcher.start()

    def outcome(self) -> IsolatedOutcome:
        """The child's outcome, once its watcher has it (the child ended or was killed on time)."""
        while self._watcher.is_alive():
            exit_if_stopped()
            self._watcher.join(timeout=0.5)
        if self._outcome is None:  # the watcher raised: say so rather than lose the row
            return IsolatedOutcome(CRASH, "the isolated probe's watcher failed")
        return self._outcome

    def _watch(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None  # Popen(stdout=PIPE) above
        selector = selectors.DefaultSelector()
        selector.register(stdout, selectors.EVENT_READ)
        deadline = self.started + self.startup_timeout_s
        ready_at: float | None = None
        payload = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                phase = "measurement" if ready_at else "setup"
                limit = self.timeout_s if ready_at else self.startup_timeout_s
                self._outcome = IsolatedOutcome(
                    HANG, f"no result {limit:.0f} s into {phase}; process group killed"
                )
                return
            if not selector.select(timeout=remaining):
                continue
            line = stdout.readline()
            if line == "":  # child exited (or was killed by the probe's clean-up)
                break
            line = line.strip()
            if line == READY and ready_at is None:
                ready_at = time.monotonic()
                deadline = ready_at + self.timeout_s
            elif line.startswith(RESULT):
                payload = json.loads(line[len(RESULT) :])
            elif line.startswith(RUNAWAY) and ready_at is not None:
                self.kill()
                self._outcome = IsolatedOutcome(
                    HANG,
                    f"reentrant backward without end: over {self.runaway_threads} threads started "
                    "into measurement (a measurement starts none); process group killed",
                )
                return
        self.process.wait(timeout=10)
        if payload is None:
            self.stderr.seek(0)
            tail = self.stderr.read().strip().splitlines()[-1:] or ["no output"]
            self._outcome = IsolatedOutcome(CRASH, f"exit {self.process.returncode}: {tail[0]}")
            return
        self._outcome = IsolatedOutcome("completed", "", payload)

    def kill(self) -> None:
        """SIGKILL the child's whole process group (it runs in its own session)."""
        if self.process.poll() is not None:
            return
        kill_group(self.process.pid)
        self.process.wait(timeout=10)
