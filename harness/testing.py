"""One-call golden check for tests, in the spirit of pytest-regressions' ``check()``::

    def test_probe_matches_golden(record_property):
        check_against_golden(records, golden_root(), record_property)

``records`` are ``Record`` objects, record files or directories of them, or records as parsed JSON
(one record object, or a list of them, as ``json.load`` returns a record file); anything else is
refused in one line. ``golden`` is a golden file, or a directory (``harness.golden.store``) in which
the golden named by the records' recipe × hardware × revision pins is looked up — so a Megatron Core
bump fails with the refresh command instead of comparing against another revision's numbers. Failures
raise ``AssertionError`` carrying the markdown table; ``record_property`` (a pytest property recorder)
gets one JUnit property per metric.

This module sits above ``harness.golden`` (judging) and ``harness.report`` (the table), which the
golden package itself cannot import: the reports render its comparisons.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from harness.errors import UsageError
from harness.golden.judge import Comparison, compare_records, missing_golden_message
from harness.golden.refresh import plan_refresh, write_refresh
from harness.golden.store import load_golden, resolve_golden, root_of, writable
from harness.record.io import load_records, records_in
from harness.record.model import Record
from harness.report.junit import record_golden_properties
from harness.report.markdown import comparison_markdown

RecordsLike = Record | Path | str | Mapping[str, object]
_TAKES = "pass Record objects, record files or directories, or records as parsed JSON (dicts)"


def as_records(records: Iterable[RecordsLike] | RecordsLike) -> list[Record]:
    """``records`` validated and typed; ``UsageError`` (one line) for what is not a record."""
    if isinstance(records, (Mapping, Record, str, os.PathLike)):  # one record, or one path
        records = [records]
    if not isinstance(records, Iterable) or isinstance(records, bytes):
        raise UsageError(f"records: cannot judge a {type(records).__name__}; {_TAKES}")
    typed: list[Record] = []
    paths: list[Path | str] = []
    for i, item in enumerate(records):
        if isinstance(item, Record):
            typed.append(item)
        elif isinstance(item, (str, os.PathLike)):
            paths.append(Path(item))
        elif isinstance(item, Mapping):
            typed += [
                Record.from_json(data, f"records[{i}]")
                for data in records_in(dict(item), f"records[{i}]")
            ]
        else:
            raise UsageError(f"records[{i}]: cannot judge a {type(item).__name__}; {_TAKES}")
    return typed + (load_records(paths) if paths else [])


def check_against_golden(
    records: Iterable[RecordsLike] | RecordsLike,
    golden: Path,
    record_property: Callable[[str, object], None] | None = None,
) -> Comparison:
    """Compare ``records`` with their golden; raise ``AssertionError`` unless every check passes."""
    try:
        loaded = as_records(records)
    except UsageError as refused:  # not records: a test failure, not bad CLI input
        raise AssertionError(str(refused)) from None
    if not loaded:
        raise AssertionError("no records to check against a golden")
    path = resolve_golden(loaded, golden)
    if not path.is_file():
        raise AssertionError(missing_golden_message(loaded, path))
    try:
        comparison = compare_records(load_golden(path), loaded, str(path))
    except UsageError as refused:  # pins differ from the named file: a test failure
        raise AssertionError(str(refused)) from None
    if record_property is not None:
        record_golden_properties(comparison, record_property)
    if not comparison.passed:
        raise AssertionError(comparison_markdown(comparison))
    return comparison


def regenerate_golden(
    records: Iterable[RecordsLike] | RecordsLike, golden: Path, command: str
) -> Sequence[Path]:
    """Write the goldens of ``records`` under ``golden`` (a golden root, or a golden file there),
    accepting failed and partial sets (what the test measured is what it wants pinned)."""
    root = root_of(golden) if Path(golden).is_file() else Path(golden)
    plans = plan_refresh(as_records(records), writable(root), command, True, True)
    write_refresh(plans)
    return [plan.path for plan in plans]
