"""Fault injection: an explicit test hook, off unless ``RECOMPUTE_HARNESS_FAULT`` (or ``run --inject-fault``) sets it.

It proves the runner's failure path end to end — classification, stage, cleanup — without needing a
real 80 GB OOM. Spec: ``KIND:iteration=I,phase=P,rank=R`` with KIND one of

- ``oom``  raise ``torch.OutOfMemoryError`` (the allocator's own exception type) at the start of phase P;
- ``nan``  multiply rank R's loss by NaN in iteration I (phase is always ``forward``, where loss is made);
- ``inf``  the same with +inf (Megatron's loss checks report it apart from NaN; both are numerical failures);
- ``hang`` block rank R forever at the start of phase P (the other ranks then wait in a collective);
- ``kill`` rank R SIGKILLs itself at the start of phase P (no error line, no error file: torchrun's
  exit code is the only evidence);
- ``exit`` rank R exits 0 at the start of phase P without reporting anything more;
- ``slow`` rank R sleeps ``ms=D`` milliseconds at the start of phase P in iteration I and every one
  after it: a row made slower in every step, which the step-time judge must name (issue 42).

Each back end fires the phases it marks (``BACKEND_PHASES``); a fault at a phase its back end never
enters is refused before launch, and a fault that was armed but never fired fails its row (runner).

``rank`` defaults to 0, ``phase`` to ``forward``, ``iteration`` to 1. An optional ``row=NAME`` limits
the fault to one row of a sweep (e.g. ``row=[]`` fails only the control); the runner hands each row's
workers at most one fault, through the environment.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import UsageError
from harness.record.schema import PHASES

if TYPE_CHECKING:
    import torch

FAULT_ENV = "RECOMPUTE_HARNESS_FAULT"
KINDS = ("oom", "nan", "inf", "hang", "kill", "exit", "slow")
LOSS_KINDS = ("nan", "inf")
# The phases each back end marks (and so can fire a fault in). The mcore loop marks every training
# phase and captures no CUDA graphs; the bridge back end sees Bridge's loop only through its callbacks
# (step start and end, where CUDA-graph capture falls) and its forward-step function (the loss).
BACKEND_PHASES = {
    "mcore": tuple(phase for phase in PHASES if phase != "cuda-graph-capture"),
    "bridge": (
        "model-build",
        "cuda-graph-capture",
        "forward",
        "backward",
        "grad-sync",
        "optimizer-step",
    ),
}
INJECTED_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB (injected by the recompute-harness fault hook "
    "at iteration {iteration}, phase {phase}, rank {rank})"
)


@dataclass(frozen=True)
class Fault:
    kind: str
    iteration: int = 1
    phase: str = "forward"
    rank: int = 0
    row: str | None = None
    delay_ms: float = 0.0  # slow: the sleep added to every step from ``iteration`` on

    def spec(self) -> str:
        row = "" if self.row is None else f",row={self.row}"
        delay = f",ms={self.delay_ms:g}" if self.kind == "slow" else ""
        return f"{self.kind}:iteration={self.iteration},phase={self.phase},rank={self.rank}{delay}{row}"

    def applies_to(self, row: str) -> bool:
        return self.row is None or self.row == row

    def fires(self, iteration: int, phase: str, rank: int) -> bool:
        if self.kind == "slow":
            return iteration >= self.iteration and (phase, rank) == (self.phase, self.rank)
        return (iteration, phase, rank) == (self.iteration, self.phase, self.rank)

    def at_phase_start(self, iteration: int, phase: str, rank: int) -> None:
        """Called by the worker as each phase starts: raise the OOM or block, when this is the spot."""
        if not self.fires(iteration, phase, rank):
            return
        if self.kind == "oom":
            import torch

            raise torch.OutOfMemoryError(
                INJECTED_OOM_MESSAGE.format(iteration=iteration, phase=phase, rank=rank)
            )
        if self.kind == "hang":
            while True:  # the runner's stall timeout kills the whole process group
                time.sleep(3600)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "exit":
            os._exit(0)
        if self.kind == "slow":
            time.sleep(self.delay_ms / 1000.0)

    def poisons(self, iteration: int, rank: int) -> bool:
        return self.kind in LOSS_KINDS and self.fires(iteration, "forward", rank)

    def poison_loss(self, loss: torch.Tensor, iteration: int, rank: int) -> torch.Tensor:
        """Called by the worker on its loss: NaN (or +inf) when this is the spot."""
        if self.poisons(iteration, rank):
            return loss * float(self.kind)
        return loss

    def check_backend(self, backend: str) -> None:
        """Refuse a fault its back end would never fire (the row would otherwise pass untested)."""
        if self.phase not in BACKEND_PHASES[backend]:
            raise UsageError(
                f"fault {self.spec()!r}: the {backend} back end never marks phase {self.phase} "
                f"(it marks {', '.join(BACKEND_PHASES[backend])})"
            )


def parse_fault(spec: str) -> Fault:
    """``oom:iteration=2,phase=backward,rank=1`` -> Fault; any mistake is one UsageError line."""
    kind, _, params = spec.partition(":")
    if kind not in KINDS:
        raise UsageError(f"fault {spec!r}: kind must be one of {', '.join(KINDS)}")
    values: dict[str, str] = {}
    for item in filter(None, params.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in ("iteration", "phase", "rank", "row", "ms") or key in values:
            raise UsageError(
                f"fault {spec!r}: expected iteration=I,phase=P,rank=R[,row=NAME], got {item!r}"
            )
        values[key] = value
    if ("ms" in values) != (kind == "slow"):
        raise UsageError(f"fault {spec!r}: ms=D (a delay per step) belongs to, and only to, slow")
    try:
        delay_ms = float(values.get("ms", "0"))
    except ValueError:
        raise UsageError(f"fault {spec!r}: ms is a number of milliseconds") from None
    if kind == "slow" and not 0 < delay_ms < 60_000:
        raise UsageError(f"fault {spec!r}: ms must be above 0 and below 60000, got {delay_ms:g}")
    phase = values.get("phase", "forward")
    if phase not in PHASES:
        raise UsageError(f"fault {spec!r}: phase must be one of {', '.join(PHASES)}")
    if kind in LOSS_KINDS and phase != "forward":
        raise UsageError(f"fault {spec!r}: a non-finite loss is made in the forward phase")
    try:
        iteration, rank = int(values.get("iteration", "1")), int(values.get("rank", "0"))
    except ValueError:
        raise UsageError(f"fault {spec!r}: iteration and rank are integers") from None
    if phase == "model-build" and iteration != 0:
        raise UsageError(f"fault {spec!r}: model-build happens at iteration 0")
    if phase != "model-build" and iteration < 1 or rank < 0:
        raise UsageError(
            f"fault {spec!r}: iterations count from 1 (0 is model-build), ranks from 0"
        )
    return Fault(kind, iteration, phase, rank, values.get("row"), delay_ms)


def fault_from_env() -> Fault | None:
    spec = os.environ.get(FAULT_ENV)
    return parse_fault(spec) if spec else None
