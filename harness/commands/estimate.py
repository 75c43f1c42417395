"""``recompute-harness estimate --recipe NAME [--json]``: per-rank retained bytes of each row, from CPU."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.commands.options import add_golden_dir
from harness.config.fields import RecomputeFields
from harness.config.revisions import collect_revisions
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.estimate.estimate import attention_backend_for, check_estimable, estimate
from harness.estimate.table import estimate_table
from harness.golden.estimate import (
    estimate_golden_path_for,
    golden_rows,
    golden_to_judge,
    judge_estimate,
    write_estimate,
)
from harness.golden.figures import FigureMismatch
from harness.golden.store import estimate_golden_path, existing, golden_root, writable
from harness.report.summary import print_summary
from harness.report.verdicts import estimate_summary
from harness.run.recipes import load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipe", required=True, help="a GPU recipe (harness/data/recipes/*.toml)"
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        metavar="ROW",
        help="rows to estimate instead of the recipe's own ([] is always included)",
    )
    parser.add_argument(
        "--attention-backend",
        choices=("unfused", "fused"),
        help="core attention on CPU (default: the recipe's: fused/flash/auto -> fused, local -> unfused)",
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--out", metavar="FILE", help="also write the JSON to FILE (for analyze --estimate)"
    )
    output.add_argument(
        "--write-golden",
        action="store_true",
        help="also write the JSON to the golden root's estimate/ under the installed revision's name",
    )
    parser.add_argument(
        "--check-golden",
        action="store_true",
        help="measure the golden's rows (or --rows, each in the golden) and judge every saving, "
        "retained byte count, peak and status against it to the byte: exit 1 naming each changed row",
    )
    add_golden_dir(
        parser, "golden root for --write-golden / --check-golden (default: tests/golden)"
    )


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    recipe = load_recipe(args.recipe)
    check_estimable(recipe)
    for row in args.rows or ():
        RecomputeFields.parse(row)
    if args.check_golden and args.write_golden:
        raise UsageError("--check-golden judges the golden; it cannot also --write-golden it")
    rows, golden = args.rows, None
    if args.check_golden:  # the golden is found and read before anything is measured
        golden_file = estimate_golden_path(
            recipe.name,
            attention_backend_for(recipe, args.attention_backend),
            collect_revisions()["megatron_core"] or {},
            existing(golden_root(args.golden_dir)),
        )
        golden = golden_to_judge(golden_file)
        rows = golden_rows(golden, args.rows, golden_file)
    if args.write_golden and not args.out:
        # refused before measuring: never into an installed package's copy
        writable(golden_root(args.golden_dir))
    try:
        result = estimate(recipe, rows, args.attention_backend)
    except RuntimeError as exc:
        print(f"recompute-harness: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    target = (
        Path(args.out)
        if args.out
        else estimate_golden_path_for(result, args.golden_dir)
        if args.write_golden
        else None
    )
    written = target is not None and write_estimate(
        result, target, keep_unchanged=args.write_golden
    )
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print(estimate_table(result))
    if target is not None and not args.json:
        print(f"{'wrote' if written else 'unchanged'} {target}")
    if golden is not None:
        mismatches = judge_estimate(golden.data, result.as_dict())
        _report_judgement(golden_file, mismatches, args.json)
        summary = estimate_summary(
            recipe.name,
            golden_file,
            mismatches,
            rows=len(result.rows),
            wall_s=time.monotonic() - started,
        )
        print_summary(summary, sys.stderr if args.json else sys.stdout)
        return EXIT_FAILED if mismatches else EXIT_OK
    return EXIT_OK


def _report_judgement(
    golden_file: Path, mismatches: list[FigureMismatch], quiet_stdout: bool
) -> None:
    """The verdict under the table (on stderr beside --json, so stdout stays one JSON document)."""
    stream = sys.stderr if quiet_stdout else sys.stdout
    if not mismatches:
        print(f"golden: every row matches {golden_file}", file=stream)
        return
    print(f"golden: {len(mismatches)} figure(s) differ from {golden_file}", file=stream)
    for mismatch in mismatches:
        print(f"  {mismatch.line()}", file=stream)
