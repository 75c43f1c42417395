"""Run a probe row that may hang in its own process group, under a timeout.

The child (``python -m harness.probe.isolated_child``) sets up gloo + the model, prints ``READY``, measures,
and prints one ``RESULT {json}`` line. The parent gives the setup ``startup_timeout_s`` and the
measurement ``timeout_s`` after ``READY``; past either, the whole process group is killed (SIGKILL)
and the row is reported as a hang. The parent never blocks the rest of the probe matrix: it starts
the child first and collects it last.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from harness.probe.plan import ProbeRow
from harness.probe.status import CRASH, HANG
from harness.processes import die_with_parent, exit_if_stopped, kill_group, libc_prctl

READY, RESULT = "READY", "RESULT "
DEFAULT_HANG_TIMEOUT_S = 10.0  # the measurement's limit after READY (`probe --hang-timeout`)


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
        seed: int = 1234,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        attention_backend: str = "unfused",
    ) -> None:
        self.model = model
        self.row = row
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        # The child also ends itself past its whole budget (on machines without a parent-death signal).
        lifetime_s = startup_timeout_s + timeout_s + 30
        command = [
            sys.executable,
            "-m",
            "harness.probe.isolated_child",
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
        ]
        if row.add_bias_linear:
            command.append("--add-bias-linear")
        for flag, value in (("--seq-length", seq_length), ("--micro-batch-size", micro_batch_size)):
            if value is not None:
                command += [flag, str(value)]
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        }
        # stderr goes to a file: a chatty child must never block on a full pipe (a false "hang").
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.started = time.monotonic()
        libc_prctl()  # loaded before the fork that runs die_with_parent
        # Its own session, so a hang is killed with its group; and it dies with this process, so a parent
        # killed outright (SIGKILL, the OOM killer) leaves no spinning deadlock behind for its lifetime.
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            start_new_session=True,
            env=env,
            preexec_fn=die_with_parent,  # noqa: PLW1509
        )

    def outcome(self) -> IsolatedOutcome:
        stdout = self.process.stdout
        assert stdout is not None  # Popen(stdout=PIPE) above
        selector = selectors.DefaultSelector()
        selector.register(stdout, selectors.EVENT_READ)
        deadline = self.started + self.startup_timeout_s
        ready_at: float | None = None
        payload = None
        while True:
            exit_if_stopped()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                phase = "measurement" if ready_at else "setup"
                limit = self.timeout_s if ready_at else self.startup_timeout_s
                return IsolatedOutcome(
                    HANG, f"no result {limit:.0f} s into {phase}; process group killed"
                )
            if not selector.select(timeout=remaining):
                continue
            line = stdout.readline()
            if line == "":  # child exited
                break
            line = line.strip()
            if line == READY and ready_at is None:
                ready_at = time.monotonic()
                deadline = ready_at + self.timeout_s
            elif line.startswith(RESULT):
                payload = json.loads(line[len(RESULT) :])
        self.process.wait(timeout=10)
        if payload is None:
            self.stderr.seek(0)
            tail = self.stderr.read().strip().splitlines()[-1:] or ["no output"]
            return IsolatedOutcome(CRASH, f"exit {self.process.returncode}: {tail[0]}")
        return IsolatedOutcome("completed", "", payload)

    def kill(self) -> None:
        """SIGKILL the child's whole process group (it runs in its own session)."""
        if self.process.poll() is not None:
            return
        kill_group(self.process.pid)
        self.process.wait(timeout=10)
