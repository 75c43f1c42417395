"""``recompute-harness select --target-gb X RECORD...``: cheapest completed row under the target (exit 1: none)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from harness.commands.options import note_unmeasured
from harness.compare.selection import select
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.record.io import load_records
from harness.report.json_report import dumps, selection_json
from harness.report.markdown import emit, selection_markdown


def _target(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--target-gb: expected a number of GB, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--target-gb: expected a positive number of GB, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target-gb",
        type=_target,
        required=True,
        help="per-rank allocated-memory target (decimal GB)",
    )
    parser.add_argument(
        "records", nargs="+", type=Path, help="run record files or directories of them"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the selection as JSON instead of markdown"
    )


def run(args: argparse.Namespace) -> int:
    selection = select(load_records(args.records), args.target_gb)
    note_unmeasured(args.records)
    if args.json:
        print(dumps(selection_json(selection)))
    else:
        emit(selection_markdown(selection))
    return EXIT_OK if selection.chosen is not None else EXIT_FAILED
