"""Strict JSON loading for run records (and any other harness JSON file), and validated writing.

Loading refuses what ``json`` would silently accept: NaN/Infinity literals, duplicated keys, and
trailing garbage. Writing is atomic (``harness.files``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.files import read_bounded_text, write_json_atomic
from harness.record.model import Record
from harness.record.schema import SCHEMA, SCHEMA_VERSION
from harness.record.step_time import ROUND_KEY


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (NaN/inf are invalid in harness files)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicated key {key!r}")
            seen.add(key)
    return result


def parse_json(text: str, source: str) -> Any:
    """Parse ``text`` strictly; any problem is one ``UsageError`` line naming ``source``."""
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{source}: malformed or truncated JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{source}: invalid JSON: {exc}") from None


def read_json(path: Path) -> Any:
    """Parse a regular file of bounded size (a FIFO or /dev/zero is refused, not read)."""
    return parse_json(read_bounded_text(Path(path)), str(path))


def write_record(path: Path, record: Record) -> None:
    """Validate, then write one record atomically (an invalid record never reaches the disk)."""
    write_json_atomic(path, record.validated().to_json())


# The runner's plan, written before the first row starts: every row and the record file it will get. A
# sweep whose runner was SIGKILLed or whose disk filled has no marker of its own; its plan tells.
SWEEP_PLAN = "SWEEP.json"
SWEEP_PLAN_SCHEMA = "recompute-harness/sweep-plan"
SWEEP_BOOKKEEPING = (
    "rows",
    "INTERRUPTED.json",
    SWEEP_PLAN,
)  # a sweep directory's own files beside records/


def write_sweep_plan(directory: Path, recipe: str, record_files: dict[str, str]) -> None:
    """``record_files``: row (the row syntax) -> its record's path relative to the sweep ``directory``."""
    write_json_atomic(
        Path(directory) / SWEEP_PLAN,
        {
            "schema": SWEEP_PLAN_SCHEMA,
            "recipe": recipe,
            "rows": [{"row": row, "record": record} for row, record in record_files.items()],
        },
    )


def _planned_rows(plan: Path) -> list[tuple[str, str]]:
    data = read_json(plan)
    rows = (
        data.get("rows")
        if isinstance(data, dict) and data.get("schema") == SWEEP_PLAN_SCHEMA
        else None
    )
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and isinstance(r.get("row"), str) and isinstance(r.get("record"), str)
        for r in rows
    ):
        raise UsageError(f"{plan}: not a sweep plan ({SWEEP_PLAN_SCHEMA}: rows of row and record)")
    return [(r["row"], r["record"]) for r in rows]


def unmeasured_rows(paths: Iterable[Path | str]) -> list[str]:
    """One line per sweep named by a directory in ``paths`` (the sweep, its ``records/``, or a folder of
    sweeps) whose plan has rows without a record. Record files named one by one are a choice, not a gap."""
    sweeps: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            continue
        if path.name == "records" and (path.parent / SWEEP_PLAN).is_file():
            sweeps.add(path.parent)
        sweeps.update(plan.parent for plan in path.rglob(SWEEP_PLAN) if plan.is_file())
    lines = []
    for sweep in sorted(sweeps):
        planned = _planned_rows(sweep / SWEEP_PLAN)
        missing = [row for row, record in planned if not (sweep / record).is_file()]
        if missing:
            lines.append(
                f"{sweep}: incomplete sweep: no record for row(s) {', '.join(missing)} of the {len(planned)} "
                "planned (its runner was stopped, killed or could not write)"
            )
    return lines


def _sweep_bookkeeping(file: Path, root: Path) -> bool:
    """A sweep's plan, row specs, evidence and markers (``SWEEP.json``, ``rows/...``, ``INTERRUPTED.json``):
    JSON, not records."""
    if file.name == SWEEP_PLAN:
        return True
    for ancestor in [file, *file.parents]:
        if ancestor == root.parent:
            break
        if ancestor.name in SWEEP_BOOKKEEPING and (ancestor.parent / "records").is_dir():
            return True
    return False


def _expand(paths: Iterable[Path | str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = [
                file for file in sorted(path.rglob("*.json")) if not _sweep_bookkeeping(file, path)
            ]
            if not found:
                gaps = unmeasured_rows([path])  # a sweep stopped before its first record says so
                raise UsageError(gaps[0] if gaps else f"{path}: directory holds no .json records")
            files.extend(found)
        else:
            files.append(path)
    return files


def records_in(data: Any, source: str) -> list[Any]:
    """A file holds one record object or a JSON array of records."""
    if isinstance(data, list):
        if not data:
            raise UsageError(f"{source}: empty record list")
        return data
    return [data]


def _is_probe_output(item: Any) -> bool:
    """The shape ``probe --json`` prints (``harness.probe.present.table.probe_json``): a common mistake to name."""
    return (
        isinstance(item, dict)
        and "schema" not in item
        and {"model", "rows", "seq_length"} <= set(item)
    )


def load_records(paths: Iterable[Path | str]) -> list[Record]:
    """Load and validate every record in ``paths`` (files or directories of ``*.json``).

    Refuses, before validating any record: inputs that are not run records, records of mixed schema
    versions; after: duplicated ids and duplicated rows (same configuration measured twice).
    """
    loaded: list[tuple[str, Any]] = []
    files = _expand(paths)
    if not files:
        raise UsageError("no record files given")
    for path in files:
        data = read_json(path)
        items = records_in(data, str(path))
        if any(_is_probe_output(item) for item in items):
            raise UsageError(
                f"{path} is `probe --json` output (per-label probe tables), not run records; "
                "use `recompute-harness probe --check-golden` for probes, and give this command "
                "the records/ directory of a `recompute-harness run` sweep"
            )
        for i, item in enumerate(items):
            loaded.append((str(path) if len(items) == 1 else f"{path}[{i}]", item))
    versions = {
        item.get("schema_version")
        for _, item in loaded
        if isinstance(item, dict) and item.get("schema") == SCHEMA
    }
    if len(versions) > 1:
        shown = ", ".join(sorted(repr(v) for v in versions))
        raise UsageError(
            f"records from mixed schema versions ({shown}); this harness reads version {SCHEMA_VERSION} only"
        )
    records = [Record.from_json(item, source) for source, item in loaded]
    _refuse_duplicates(records, [source for source, _ in loaded])
    return records


def row_key(record: Record) -> str:
    """What makes two records the same row: everything that was configured, nothing that was measured;
    a sweep in rounds measures each row once per round."""
    workload = {k: v for k, v in record.workload.to_json().items() if k != "extra"}
    return json.dumps(
        [
            record.kind,
            record.workload.extra.get(ROUND_KEY),
            workload,
            record.hardware.profile(),
            record.revisions.to_json(),
            record.recompute.as_dict(),
        ],
        sort_keys=True,
    )


def _refuse_duplicates(records: list[Record], sources: list[str]) -> None:
    by_id: dict[str, str] = {}
    by_row: dict[str, str] = {}
    for record, source in zip(records, sources):
        if record.id in by_id:
            raise UsageError(
                f"{source}: duplicated record id {record.id!r} (also in {by_id[record.id]})"
            )
        by_id[record.id] = source
        key = row_key(record)
        if key in by_row:
            raise UsageError(f"{source}: duplicated row: same configuration as {by_row[key]}")
        by_row[key] = source
