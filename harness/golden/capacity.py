"""Capacity goldens: ``plan --write-golden``'s file per recipe x attention back end x MCore sources,
judged by ``plan --check-golden``: per row its status, whether it fits, and each rank's peak, phase
and module; the chosen row. The plan is deterministic on CPU (exact parameter counts, the estimate's
exact bytes), so figures are judged to the byte: a Megatron Core bump that moves a row across its
budget, or moves its peak, fails naming the rank, phase and module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.files import write_json_atomic
from harness.golden.figures import FigureMismatch
from harness.record.io import read_json

REQUIRED_KEYS = ("workload", "budget_bytes", "chosen", "rows", "provenance")
WORKLOAD_KEYS = ("workload", "budget_bytes", "margin", "parallelism", "training")
ROW_KEYS = ("status", "fits", "peak_bytes")
RANK_KEYS = ("peak_bytes", "iteration", "phase", "module")


def load_capacity_golden(path: Path) -> dict[str, Any]:
    """The golden at ``path``; a missing or malformed file is bad input (one line)."""
    if not Path(path).is_file():
        raise UsageError(
            f"no capacity golden {path} (write one with plan --recipe ... --write-golden)"
        )
    data = read_json(Path(path))
    if not isinstance(data, dict) or any(key not in data for key in REQUIRED_KEYS):
        raise UsageError(f"{path}: not a capacity golden (needs {', '.join(REQUIRED_KEYS)})")
    return data


def write_capacity(plan: dict[str, Any], target: Path) -> bool:
    """Write ``plan`` atomically unless the file holds the same figures; whether it was written."""
    if target.is_file():
        try:
            before = load_capacity_golden(target)
        except UsageError:
            before = None
        if before is not None and _measured(before) == _measured(plan):
            return False
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, plan)
    return True


def _measured(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in ("provenance", "revisions")}


def judge_capacity(golden: dict[str, Any], actual: dict[str, Any]) -> list[FigureMismatch]:
    """Every workload field, chosen row and row figure of ``actual`` that differs from ``golden``."""
    mismatches = [
        FigureMismatch("workload", key, golden.get(key), actual.get(key))
        for key in WORKLOAD_KEYS
        if golden.get(key) != actual.get(key)
    ]
    if golden["chosen"] != actual["chosen"]:
        mismatches.append(FigureMismatch("plan", "chosen", golden["chosen"], actual["chosen"]))
    by_label = {row["label"]: row for row in golden["rows"]}
    for row in actual["rows"]:
        where = f"row {row['label']!r}"
        expected = by_label.get(row["label"])
        if expected is None:
            mismatches.append(FigureMismatch(where, "row", "absent", row["status"]))
            continue
        mismatches += [
            FigureMismatch(where, key, expected.get(key), row.get(key))
            for key in ROW_KEYS
            if expected.get(key) != row.get(key)
        ]
        golden_ranks = {tuple(r["ranks"]): r for r in expected.get("per_rank", [])}
        for rank in row.get("per_rank", []):
            before = golden_ranks.get(tuple(rank["ranks"]), {})
            span = f"{where} ranks {rank['ranks'][0]}-{rank['ranks'][-1]}"
            mismatches += [
                FigureMismatch(span, key, before.get(key), rank.get(key))
                for key in RANK_KEYS
                if before.get(key) != rank.get(key)
            ]
    return mismatches
