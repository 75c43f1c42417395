"""Estimate goldens: ``estimate --write-golden``'s file per recipe × attention back end × MCore sources,
read back through a typed model, and rewritten only when a measured value changed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.estimate.estimate import Estimate
from harness.files import write_json_atomic
from harness.golden.store import estimate_golden_path
from harness.record.io import read_json

# The keys every estimate golden holds (``Estimate.as_dict``); a file without them is not one.
REQUIRED_KEYS = ("recipe", "attention_backend", "rows", "revisions", "provenance")
REQUIRED_ROW_KEYS = ("label", "status", "retained_bytes")


@dataclass(frozen=True)
class EstimateGolden:
    """An estimate golden as read: its identity, its rows and provenance, and the whole document."""

    recipe: str
    attention_backend: str
    rows: list[dict[str, Any]]
    provenance: dict[str, Any]
    data: dict[str, Any]

    @classmethod
    def from_json(cls, data: Any, source: str) -> EstimateGolden:
        """The golden in ``data``; ``UsageError`` (one line naming ``source``) when it is not one."""
        if not isinstance(data, dict):
            raise UsageError(f"{source}: not an estimate golden (expected an object)")
        missing = [key for key in REQUIRED_KEYS if key not in data]
        if missing:
            raise UsageError(f"{source}: not an estimate golden (missing {', '.join(missing)})")
        rows = data["rows"]
        if not isinstance(rows, list) or not all(
            isinstance(row, dict) and all(key in row for key in REQUIRED_ROW_KEYS) for row in rows
        ):
            raise UsageError(
                f"{source}: rows: expected objects with {', '.join(REQUIRED_ROW_KEYS)}"
            )
        for key in ("recipe", "attention_backend"):
            if not isinstance(data[key], str):
                raise UsageError(f"{source}: {key}: expected a string")
        if not isinstance(data["provenance"], dict):
            raise UsageError(f"{source}: provenance: expected an object")
        return cls(data["recipe"], data["attention_backend"], rows, data["provenance"], data)

    def measured(self) -> dict[str, Any]:
        """Everything but the provenance: what a re-run must reproduce for the file to stay."""
        return {key: value for key, value in self.data.items() if key != "provenance"}


def estimate_golden_path_for(estimate: Estimate, root: Path | None = None) -> Path:
    """Where ``estimate``'s golden lives under the golden root (``harness.golden.store``)."""
    return estimate_golden_path(
        estimate.recipe,
        estimate.attention_backend,
        estimate.revisions.get("megatron_core") or {},
        root,
    )


def load_estimate_golden(path: Path) -> EstimateGolden:
    return EstimateGolden.from_json(read_json(Path(path)), str(path))


def write_estimate(estimate: Estimate, target: Path, *, keep_unchanged: bool) -> bool:
    """Write ``estimate``'s JSON to ``target`` atomically; whether it was written. With
    ``keep_unchanged`` (a golden) a file that holds the same measurements is left alone: only its
    provenance would differ; one that is not readable as an estimate golden is replaced."""
    data = estimate.as_dict()
    if keep_unchanged and target.is_file():
        try:
            before = load_estimate_golden(target).measured()
        except UsageError:
            before = None
        if before == {key: value for key, value in data.items() if key != "provenance"}:
            return False
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, data)
    return True
