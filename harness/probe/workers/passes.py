"""Run a probe's passes (one model at one precision each) on worker processes, one per usable core.

A pass is single-threaded (``harness.probe.runner.single_thread``: tiny matmuls run faster on one
intra-op thread), so ``probe --all`` used one core of the CI machine's two. With ``jobs`` above 1, up
to ``jobs`` workers (``python -m harness.probe.workers.pass_worker``) each import torch and Megatron Core once
and take the next pass as they finish one; results come back as ``probe --json`` and are returned in
the passes' order, so tables, JSON and goldens are the same as one process's. Each worker runs in a
session of its own and dies with the harness; a stop signal, an interrupt or a failed worker kills
them all. A pass's rows keep their own watchdogs (``harness.probe.runner.watchdog``); a pass is also
bounded as a whole, so a worker stuck before its rows start is killed and reported.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from harness.errors import UsageError
from harness.probe.runner import ModelProbe, probe_models
from harness.probe.workers.pass_worker import RESULT, USAGE
from harness.processes import exit_if_stopped, kill_group, start_in_own_session

# Told of each finished pass: (its probe, passes finished, passes in all).
PassDone = Callable[[ModelProbe, int, int], None]

PASS_TIMEOUT_S = 1800.0  # a whole pass, import included; rows time out long before (120 s each)


def probe_passes(
    models: Sequence[str],
    precisions: Sequence[str],
    *,
    jobs: int,
    backends: Sequence[str] = ("unfused",),
    pass_timeout_s: float = PASS_TIMEOUT_S,
    on_done: PassDone | None = None,
    **options: Any,
) -> list[ModelProbe]:
    """Every model at every precision and core-attention back end (back end-major, then precision, as
    ``probe``'s output is ordered), each by ``harness.probe.runner.probe_models`` with ``options``: in
    this process when ``jobs`` is 1 or there is one pass, else on ``min(jobs, passes)`` workers, which
    take the passes of every back end from one queue. ``on_done`` hears of each finished pass (in
    this process a precision's passes finish together)."""
    passes = [
        _Pass(model, precision, backend)
        for backend in backends
        for precision in precisions
        for model in models
    ]
    done = on_done or (lambda probe, finished, total: None)
    if jobs <= 1 or len(passes) <= 1:
        probes: list[ModelProbe] = []
        for backend in backends:
            for precision in precisions:
                for probe in probe_models(
                    list(models), precision=precision, attention_backend=backend, **options
                ):
                    probes.append(probe)
                    done(probe, len(probes), len(passes))
        return probes
    return _on_workers(passes, min(jobs, len(passes)), options, pass_timeout_s, done)


@dataclass(frozen=True)
class _Pass:
    model: str
    precision: str
    attention_backend: str

    def __str__(self) -> str:
        qualifiers = [self.precision] + (
            [self.attention_backend] if self.attention_backend != "unfused" else []
        )
        return f"{self.model} ({', '.join(qualifiers)})"


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    stderr: IO[str]
    buffer: bytearray = field(default_factory=bytearray)
    task: int | None = None  # the index of the pass it runs
    started: float = 0.0

    def send(self, index: int, task: _Pass) -> None:
        assert self.process.stdin is not None  # Popen(stdin=PIPE)
        self.process.stdin.write(json.dumps(asdict(task)).encode() + b"\n")
        self.process.stdin.flush()
        self.task, self.started = index, time.monotonic()

    def lines(self) -> list[str] | None:
        """The whole lines it printed since the last call; None once it has exited."""
        assert self.process.stdout is not None  # Popen(stdout=PIPE)
        chunk = os.read(self.process.stdout.fileno(), 1 << 20)
        if not chunk:
            return None
        self.buffer += chunk
        *whole, rest = self.buffer.split(b"\n")
        self.buffer = bytearray(rest)
        return [line.decode(errors="replace") for line in whole]

    def why_it_died(self) -> str:
        """Its exit and the line that says why (the harness's own error line, else its last line)."""
        code = self.process.wait()
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        said = [line for line in lines if line.startswith("recompute-harness: error:")]
        return f"exit {code}: {(said or lines or ['no output'])[-1]}"

    def stop(self) -> None:
        kill_group(self.process.pid)
        self.process.wait()
        self.stderr.close()


def _start_worker(options: dict[str, Any]) -> _Worker:
    return _Worker(
        *start_in_own_session(
            [
                sys.executable,
                "-m",
                "harness.probe.workers.pass_worker",
                "--options",
                json.dumps(options),
            ],
            stdin=subprocess.PIPE,
        )
    )


def _next_pass(waiting: list[tuple[int, _Pass]], took: dict[str, float]) -> tuple[int, _Pass]:
    """Take the next pass off ``waiting``: one whose model has not run yet, in order, else the one
    whose model's earlier pass took longest. A model's passes cost alike at every precision, so the
    last precision's passes go longest first and the workers finish together, not one of them
    alone on a long pass."""
    chosen = max(range(len(waiting)), key=lambda i: (took.get(waiting[i][1].model, math.inf), -i))
    return waiting.pop(chosen)


def _on_workers(
    passes: list[_Pass],
    jobs: int,
    options: dict[str, Any],
    pass_timeout_s: float,
    done: PassDone,
) -> list[ModelProbe]:
    waiting = list(enumerate(passes))
    took: dict[str, float] = {}  # model -> seconds its last finished pass took
    results: dict[int, ModelProbe] = {}
    workers: list[_Worker] = []
    selector = selectors.DefaultSelector()
    try:
        for _ in range(jobs):
            worker = _start_worker(options)
            workers.append(worker)
            selector.register(worker.process.stdout, selectors.EVENT_READ, worker)  # type: ignore[arg-type]
            worker.send(*_next_pass(waiting, took))
        while len(results) < len(passes):
            exit_if_stopped()
            for key, _ in selector.select(timeout=1.0):
                worker = key.data
                lines = worker.lines()
                if lines is None:
                    raise RuntimeError(
                        f"the probe worker of {passes[worker.task]} died, {worker.why_it_died()}"
                    )
                for line in lines:
                    if line.startswith(USAGE):
                        raise UsageError(line[len(USAGE) :])
                    if not line.startswith(RESULT):
                        continue  # Megatron Core's own output
                    results[worker.task] = ModelProbe.from_dict(json.loads(line[len(RESULT) :]))
                    done(results[worker.task], len(results), len(passes))
                    took[passes[worker.task].model] = time.monotonic() - worker.started
                    worker.task = None
                    if waiting:
                        worker.send(*_next_pass(waiting, took))
            for worker in workers:
                if worker.task is not None and time.monotonic() - worker.started > pass_timeout_s:
                    raise RuntimeError(
                        f"hang: the probe pass of {passes[worker.task]} ran past "
                        f"{pass_timeout_s:.0f} s; its worker was killed"
                    )
    finally:
        for worker in workers:
            worker.stop()
    return [results[index] for index in range(len(passes))]
