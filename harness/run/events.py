"""Per-rank evidence: each rank appends one JSON line per phase, iteration and error to its own file.

The runner reads these files while a row runs (live progress) and after it ends (the record and the
failure classification). A line is written and flushed before the phase it announces starts, so a
rank that hangs or is killed still leaves the exact iteration and phase it stopped in.

Line kinds: ``start`` (rank, world size, pid, host, device kind), ``device`` (GPU name and SM, once the
back end has set CUDA up), ``revisions`` (the stack this rank's own interpreter imports: the pins its
record carries, read where the rank runs, inside its container), ``phase`` (iteration, phase), ``iteration`` (loss, step time,
allocated/reserved peaks, device memory in use; written at the step's end), ``flops`` (an
iteration's model FLOPs, once the back end knows them), ``note`` (how the workload actually ran,
e.g. a dispatcher fallback), ``fault`` (the injected fault fired here), ``error`` (iteration, phase,
exception type and message, whether this rank's own loss was finite), ``done``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from harness.record.schema import PHASES  # the order a step reaches them; ranks how far a run got

EVENTS_DIR = "events"
SPEC_FILE = "spec.json"  # the row spec the runner writes and every worker reads


def events_path(row_dir: Path, rank: int) -> Path:
    return Path(row_dir) / EVENTS_DIR / f"rank{rank}.jsonl"


class EventWriter:
    """The worker side: one append-only line per event, flushed at once (cheap: no fsync, no device sync)."""

    def __init__(self, row_dir: Path, rank: int) -> None:
        path = events_path(row_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.rank = rank

    def emit(self, event: str, **fields: Any) -> None:
        fields = {key: _finite_or_none(value) for key, value in fields.items()}
        self._file.write(
            json.dumps({"event": event, "t": time.time(), **fields}, allow_nan=False) + "\n"
        )
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


@dataclass
class RankEvidence:
    """Everything one rank reported, in order."""

    rank: int
    started: bool = False
    device_name: str | None = None  # e.g. "NVIDIA H100 80GB HBM3"; None on CPU
    sm: str | None = None  # compute capability, e.g. "9.0"
    iteration: int = 0
    phase: str | None = None
    iterations: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    flops: dict[int, float] = field(default_factory=dict)  # iteration -> the world's model FLOPs
    fault_fired: bool = False
    done: bool = False
    last_time: float | None = None
    pid: int | None = None  # the worker's pid on ``host`` (the runner watches it on its own host)
    host: str | None = None
    revisions: dict[str, Any] | None = (
        None  # ``collect_revisions()`` as this rank's interpreter sees it
    )
    # The recorded variables (harness.run.environment) as the rank ran with them; None: never reported.
    environment: dict[str, str] | None = None

    @property
    def position(self) -> tuple[int, int]:
        """How far the rank got: (iteration, phase index) — comparable across ranks and rows."""
        return (self.iteration, PHASES.index(self.phase) if self.phase in PHASES else -1)


def read_rank(path: Path, rank: int) -> RankEvidence:
    """Parse one rank's file; a torn last line (the rank was killed mid-write) is ignored."""
    evidence = RankEvidence(rank=rank)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return evidence
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        evidence.last_time = event.get("t", evidence.last_time)
        kind = event.get("event")
        if kind == "start":
            evidence.started = True
            evidence.pid, evidence.host = event.get("pid"), event.get("host")
        elif kind == "revisions":
            evidence.revisions = event["revisions"]
        elif kind == "device":
            evidence.device_name, evidence.sm = event["name"], event["sm"]
        elif kind == "phase":
            evidence.iteration, evidence.phase = event["iteration"], event["phase"]
        elif kind == "iteration":
            evidence.iterations.append(event)
        elif kind == "error":
            evidence.errors.append(event)
        elif kind == "environment":
            evidence.environment = {str(k): str(v) for k, v in event["values"].items()}
        elif kind == "note":
            evidence.notes[event["key"]] = str(event["value"])
        elif kind == "flops":
            evidence.flops[event["iteration"]] = float(event["flops"])
        elif kind == "fault":
            evidence.fault_fired = True
        elif kind == "done":
            evidence.done = True
    return evidence


def read_row(row_dir: Path, world_size: int) -> list[RankEvidence]:
    return [read_rank(events_path(row_dir, rank), rank) for rank in range(world_size)]


def latest_activity(ranks: list[RankEvidence]) -> float | None:
    times = [rank.last_time for rank in ranks if rank.last_time is not None]
    return max(times) if times else None
