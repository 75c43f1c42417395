"""``recompute-harness nightly list|recipes|check|compare RECORDS``: the nightly GPU tier's one list of
compared cases (``harness.golden.nightly``), as ci/nightly-gpu.sh and ci/golden-refresh.sh read it.

- ``list``: ``CASE GOLDEN`` per line, the golden file each case is compared with on the installed stack
  (``-``: none yet for its pins); runs nothing.
- ``recipes``: the cases' recipes, one a line (what a golden refresh runs).
- ``check``: one line per case without a golden for the installed pins (case, pins, refresh command);
  exit 1 when there is one.
- ``compare RECORDS``: one sweep's records against the golden the nightly compares them with (markdown);
  exit 1 on a difference, 2 when there is no golden or it is another workload's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.golden.nightly import NIGHTLY_CASES, compare_sweep, golden_for, installed_pins
from harness.golden.store import golden_root
from harness.report.markdown import comparison_markdown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "recipes", "check", "compare"))
    parser.add_argument("records", nargs="?", type=Path, help="compare: a sweep's records folder")


def run(args: argparse.Namespace) -> int:
    if args.action == "recipes":
        print("\n".join(case.recipe for case in NIGHTLY_CASES))
        return EXIT_OK
    root = golden_root()
    if args.action == "compare":
        if args.records is None:
            raise UsageError("nightly compare needs a sweep's records folder")
        comparison = compare_sweep(args.records, root)
        print(comparison_markdown(comparison))
        return EXIT_OK if comparison.passed else EXIT_FAILED
    installed = installed_pins()
    found = [golden_for(case, installed, root) for case in NIGHTLY_CASES]
    if args.action == "list":
        for entry in found:
            print(entry.case.recipe, "-" if entry.path is None else entry.path.name)
        return EXIT_OK
    missing = [entry.missing_line(installed) for entry in found if entry.path is None]
    for line in missing:
        print(line)
    return EXIT_FAILED if missing else EXIT_OK
