"""``recompute-harness golden refresh RECORD...``: write the golden for the records' revision pins."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from harness.commands.options import add_golden_dir
from harness.errors import EXIT_OK
from harness.golden.refresh import plan_refresh, write_refresh
from harness.golden.store import golden_root, writable
from harness.record.io import load_records, unmeasured_rows
from harness.report.json_report import dumps
from harness.report.markdown import emit, refresh_markdown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    refresh = actions.add_parser(
        "refresh", help="write the golden for the records' recipe × hardware × revision pins"
    )
    refresh.add_argument(
        "records", nargs="+", type=Path, help="fresh run record files or directories of them"
    )
    add_golden_dir(refresh)
    refresh.add_argument(
        "--allow-failed",
        action="store_true",
        help="accept rows that did not complete (expected OOMs)",
    )
    refresh.add_argument(
        "--allow-partial",
        action="store_true",
        help="accept a set missing rows of the previous golden or of its own sweep's plan (SWEEP.json)",
    )
    refresh.add_argument(
        "--dry-run", action="store_true", help="print the diff, write nothing (marked as a dry run)"
    )
    refresh.add_argument(
        "--json",
        action="store_true",
        help="print what was (or would be) written as JSON instead of markdown; no step summary",
    )


def run(args: argparse.Namespace) -> int:
    command = "recompute-harness " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])
    plans = plan_refresh(
        load_records(args.records),
        golden_root(args.golden_dir),
        command,
        args.allow_failed,
        args.allow_partial,
        unmeasured_rows(args.records),
    )
    if not args.dry_run:
        writable(golden_root(args.golden_dir))
        write_refresh(plans)
    if args.json:
        print(
            dumps(
                {
                    "dry_run": args.dry_run,
                    "goldens": [
                        {
                            "path": str(plan.path),
                            "written": not args.dry_run,
                            "previous": None if plan.previous is None else str(plan.previous),
                            "diff": [
                                {
                                    "row": row,
                                    "metric": metric,
                                    "old": old,
                                    "new": new,
                                    "delta_pct": delta,
                                }
                                for row, metric, old, new, delta in plan.diff
                            ],
                        }
                        for plan in plans
                    ],
                }
            )
        )
        return EXIT_OK
    for plan in plans:
        emit(
            refresh_markdown(
                str(plan.path),
                plan.diff,
                None if plan.previous is None else str(plan.previous),
                dry_run=args.dry_run,
            )
        )
    return EXIT_OK
