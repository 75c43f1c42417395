"""``recompute-harness matrix [--check]``: the compatibility matrix, or its differential check."""

from __future__ import annotations

import argparse
import json

from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.matrix.drift import DEFAULT_CHECK_COUNT, drift_report
from harness.report.json_report import matrix_json
from harness.report.markdown import matrix_markdown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check", action="store_true", help="compare the matrix with the real validator"
    )
    parser.add_argument(
        "--count", type=int, default=DEFAULT_CHECK_COUNT, help="configurations to check"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the configuration sample")
    parser.add_argument(
        "--json", action="store_true", help="print the matrix (or the check's result) as JSON"
    )


def run(args: argparse.Namespace) -> int:
    if not args.check:
        print(json.dumps(matrix_json(), indent=2) if args.json else matrix_markdown())
        return EXIT_OK
    if args.count <= 0:
        raise UsageError("--count must be positive")
    lines, drifted, summary = drift_report(args.count, args.seed)
    print(json.dumps(summary, indent=2) if args.json else "\n".join(lines))
    return EXIT_FAILED if drifted else EXIT_OK
