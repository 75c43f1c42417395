"""``recompute-harness compare [--golden FILE|DIR] RECORD...``: exit 0 within tolerance, 1 regression, 2 refused.

``--golden`` may be a golden file or a directory (a golden root): then the golden named by the records'
recipe × hardware × revision pins is picked; without it, the golden root (``--golden-dir``, the
environment, the checkout) is searched the same way."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.options import add_golden_dir, note_unmeasured
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.golden.judge import compare_records, missing_golden_message
from harness.golden.store import existing, golden_root, load_golden, resolve_golden
from harness.record.io import load_records
from harness.report.json_report import comparison_json, dumps
from harness.report.markdown import comparison_markdown, emit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--golden", type=Path, help="golden file, or a directory to pick the records' golden from"
    )
    add_golden_dir(parser)
    parser.add_argument(
        "records", nargs="+", type=Path, help="run record files or directories of them"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the comparison as JSON instead of markdown"
    )


def run(args: argparse.Namespace) -> int:
    records = load_records(args.records)
    note_unmeasured(args.records)
    path = resolve_golden(
        records, args.golden if args.golden is not None else existing(golden_root(args.golden_dir))
    )
    if path != args.golden and not path.is_file():  # picked by the records' pins, and absent
        raise UsageError(missing_golden_message(records, path))
    golden = load_golden(path)
    comparison = compare_records(golden, records, str(path))
    if args.json:
        print(dumps(comparison_json(comparison)))
    else:
        emit(comparison_markdown(comparison))
    return EXIT_OK if comparison.passed else EXIT_FAILED
