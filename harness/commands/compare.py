"""``recompute-harness compare --golden FILE RECORD...``: exit 0 within tolerance, 1 regression, 2 refused."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.compare.comparator import compare_records
from harness.errors import EXIT_FAILED, EXIT_OK
from harness.record.golden import load_golden
from harness.record.io import load_records
from harness.report.json_report import comparison_json, dumps
from harness.report.markdown import comparison_markdown, emit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--golden", type=Path, required=True, help="golden file (tests/golden/...)")
    parser.add_argument("records", nargs="+", type=Path, help="run record files or directories of them")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON instead of markdown")


def run(args: argparse.Namespace) -> int:
    golden = load_golden(args.golden)
    comparison = compare_records(golden, load_records(args.records), str(args.golden))
    if args.json:
        print(dumps(comparison_json(comparison)))
    else:
        emit(comparison_markdown(comparison))
    return EXIT_OK if comparison.passed else EXIT_FAILED
