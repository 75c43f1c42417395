"""Golden refresh: fresh records → the golden for their revision pins, plus an old → new diff.

Only the golden named by the records' own recipe × hardware × pins is written; goldens of other
revisions are read (for the diff and the tolerance policy) and never touched. Failed or partial sets
are refused unless the caller says so. Every golden is validated before the first one is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.golden.format import Golden, golden_from_records
from harness.golden.store import golden_path_for, newest_like, write_golden
from harness.record.build import now_iso
from harness.record.model import Number, Record

REFRESH_SOURCE = "recompute-harness golden refresh"

# (row, metric, old, new, Δ%): old and new are outcome statuses, metric values or "present"/"removed".
DiffLine = tuple[str, str, str | Number | None, str | Number | None, float | None]


@dataclass
class Refreshed:
    path: Path
    golden: Golden
    previous: Path | None
    diff: list[DiffLine]


def _diff(old: Golden | None, new: Golden) -> list[DiffLine]:
    old_rows = {row.label: row for row in (old.rows if old is not None else [])}
    lines: list[DiffLine] = []
    for row in new.rows:
        before = old_rows.pop(row.label, None)
        old_outcome = None if before is None else before.outcome["status"]
        if old_outcome != row.outcome["status"]:
            lines.append((row.label, "outcome", old_outcome, row.outcome["status"], None))
        for metric, value in row.values.items():
            previous = None if before is None else before.values.get(metric)
            delta = (
                None
                if previous in (None, 0) or value is None
                else (value - previous) / abs(previous) * 100.0
            )
            lines.append((row.label, metric, previous, value, delta))
    for label in old_rows:
        lines.append((label, "row", "present", "removed", None))
    return lines


def _refuse_incomplete(
    records: Sequence[Record],
    previous: Golden | None,
    allow_failed: bool,
    allow_partial: bool,
    unmeasured: Sequence[str],
) -> None:
    if not allow_failed:
        failed = [
            f"{r.id} ({r.outcome.status})"
            for r in records
            if r.outcome.status != "completed"
            or (r.kind != "cpu-probe" and r.run_metrics.nan_iterations)
        ]
        if failed:
            raise UsageError(
                f"refusing to write a golden from failed records: {', '.join(failed)}; "
                "pass --allow-failed if the failures are the expected result"
            )
    if allow_partial:
        return
    if (
        unmeasured
    ):  # a first golden has no previous rows to miss: the sweep's own plan is the reference
        raise UsageError(
            f"refusing a partial record set: {'; '.join(unmeasured)}; pass --allow-partial to write it anyway"
        )
    short = [
        r.id
        for r in records
        if r.kind == "run"
        and r.outcome.status == "completed"
        and (r.outcome.iteration or 0) < (r.workload.train_iters or 0)
    ]
    if short:
        raise UsageError(
            f"refusing a partial record set: {', '.join(short)} stopped before train_iters; "
            "pass --allow-partial to write it anyway"
        )
    if previous is not None:
        labels = {r.label for r in records}
        missing = [row.label for row in previous.rows if row.label not in labels]
        if missing:
            raise UsageError(
                f"refusing a partial record set: rows {', '.join(missing)} of the previous golden "
                "were not measured; pass --allow-partial to drop them"
            )


def plan_refresh(
    records: Sequence[Record],
    golden_root: Path,
    command: str,
    allow_failed: bool = False,
    allow_partial: bool = False,
    unmeasured: Sequence[str] = (),
) -> list[Refreshed]:
    """Build (not write) one golden per recipe × hardware × pin group of ``records``; ``unmeasured``: the
    lines ``harness.record.io.unmeasured_rows`` found for the sweeps they came from."""
    groups: dict[Path, list[Record]] = {}
    for record in records:
        if record.kind == "reference":
            raise UsageError(
                f"{record.id}: reference records are transcribed (python -m harness.golden.seed), not refreshed"
            )
        if record.kind == "run" and record.hardware.device == "cpu":
            # CPU step times and peaks vary run to run far beyond a timing golden's tolerance; the
            # CPU's deterministic measurements are the probe's goldens (probe --write-golden).
            raise UsageError(
                f"{record.id}: a CPU run record cannot become a timing golden; "
                "CPU goldens come from: recompute-harness probe --all --write-golden"
            )
        groups.setdefault(golden_path_for([record], Path(golden_root)), []).append(record)
    plans = []
    for target, group in groups.items():
        first = group[0]
        found = newest_like(target)
        previous_path, previous = (None, None) if found is None else found
        _refuse_incomplete(group, previous, allow_failed, allow_partial, unmeasured)
        golden = golden_from_records(
            group,
            provenance={
                "source": REFRESH_SOURCE,
                "command": command,
                "host": first.hardware.host,
                "date": now_iso(),
                "gpu": f"{first.hardware.gpu_count}x {first.hardware.device}",
                "driver": first.revisions.driver,
            },
            tolerance=None if previous is None else previous.tolerance,
        )
        plans.append(Refreshed(target, golden, previous_path, _diff(previous, golden)))
    return plans


def write_refresh(plans: Sequence[Refreshed]) -> None:
    for plan in plans:
        write_golden(plan.path, plan.golden)
