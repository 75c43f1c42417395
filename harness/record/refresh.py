"""Golden refresh: fresh records → the golden for their revision pins, plus an old → new diff.

Only the golden named by the records' own recipe × hardware × pins is written; goldens of other
revisions are read (for the diff and the tolerance policy) and never touched. Failed or partial sets
are refused unless the caller says so. Every golden is validated before the first one is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from harness.errors import UsageError
from harness.record.build import now_iso
from harness.record.golden import (
    golden_filename, golden_from_records, hardware_of, load_golden, pins_of, row_label, write_golden,
)

REFRESH_SOURCE = "recompute-harness golden refresh"


@dataclass
class Refreshed:
    path: Path
    golden: dict[str, Any]
    previous: Path | None
    diff: list[tuple[str, str, Any, Any, float | None]]  # (row, metric, old, new, Δ%)


def _previous_golden(golden_dir: Path, target: Path, recipe: str, hardware: dict[str, Any]) -> Path | None:
    """The golden this refresh replaces: the same file, else the newest one for the same recipe × hardware."""
    if target.exists():
        return target
    candidates = []
    for path in sorted(golden_dir.glob("*.json")):
        try:
            golden = load_golden(path)
        except UsageError:
            continue  # label manifests and other JSON in the directory are not goldens
        if golden["recipe"] == recipe and golden["hardware"] == hardware:
            candidates.append((str(golden["provenance"].get("date") or ""), str(path), path))
    return max(candidates)[2] if candidates else None


def _diff(old: dict[str, Any] | None, new: dict[str, Any]) -> list[tuple[str, str, Any, Any, float | None]]:
    old_rows = {row["label"]: row for row in (old or {}).get("rows", [])}
    lines = []
    for row in new["rows"]:
        before = old_rows.pop(row["label"], None)
        old_outcome = None if before is None else before["outcome"]["status"]
        if old_outcome != row["outcome"]["status"]:
            lines.append((row["label"], "outcome", old_outcome, row["outcome"]["status"], None))
        for metric, value in row["values"].items():
            previous = None if before is None else before["values"].get(metric)
            delta = None if previous in (None, 0) or value is None else (value - previous) / abs(previous) * 100.0
            lines.append((row["label"], metric, previous, value, delta))
    for label in old_rows:
        lines.append((label, "row", "present", "removed", None))
    return lines


def _refuse_incomplete(records: Sequence[dict[str, Any]], previous: dict[str, Any] | None,
                       allow_failed: bool, allow_partial: bool) -> None:
    if not allow_failed:
        failed = [f"{r['id']} ({r['outcome']['status']})" for r in records
                  if r["outcome"]["status"] != "completed" or r["metrics"].get("nan_iterations")]
        if failed:
            raise UsageError(f"refusing to write a golden from failed records: {', '.join(failed)}; "
                             "pass --allow-failed if the failures are the expected result")
    if allow_partial:
        return
    short = [r["id"] for r in records if r["kind"] == "run" and r["outcome"]["status"] == "completed"
             and (r["outcome"]["iteration"] or 0) < (r["workload"]["train_iters"] or 0)]
    if short:
        raise UsageError(f"refusing a partial record set: {', '.join(short)} stopped before train_iters; "
                         "pass --allow-partial to write it anyway")
    if previous is not None:
        labels = {row_label(r) for r in records}
        missing = [row["label"] for row in previous["rows"] if row["label"] not in labels]
        if missing:
            raise UsageError(f"refusing a partial record set: rows {', '.join(missing)} of the previous golden "
                             "were not measured; pass --allow-partial to drop them")


def plan_refresh(records: Sequence[dict[str, Any]], golden_dir: Path, command: str,
                 allow_failed: bool = False, allow_partial: bool = False) -> list[Refreshed]:
    """Build (not write) one golden per recipe × hardware × pin group of ``records``."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["kind"] == "reference":
            raise UsageError(f"{record['id']}: reference records are transcribed (python -m harness.record.seed), not refreshed")
        name = golden_filename(record["workload"]["recipe"], hardware_of(record), pins_of(record))
        groups.setdefault(name, []).append(record)
    plans = []
    for name, group in groups.items():
        target = Path(golden_dir) / name
        first = group[0]
        previous_path = _previous_golden(Path(golden_dir), target, first["workload"]["recipe"], hardware_of(first))
        previous = None if previous_path is None else load_golden(previous_path)
        _refuse_incomplete(group, previous, allow_failed, allow_partial)
        golden = golden_from_records(
            group,
            provenance={
                "source": REFRESH_SOURCE, "command": command, "host": first["hardware"]["host"], "date": now_iso(),
                "gpu": f"{first['hardware']['gpu_count']}x {first['hardware']['device']}",
                "driver": first["revisions"]["driver"],
            },
            tolerance=None if previous is None else previous["tolerance"],
        )
        plans.append(Refreshed(target, golden, previous_path, _diff(previous, golden)))
    return plans


def write_refresh(plans: Sequence[Refreshed]) -> None:
    for plan in plans:
        write_golden(plan.path, plan.golden)
