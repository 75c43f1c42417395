"""``recompute-harness estimate --recipe NAME [--json]``: per-rank retained bytes of each row, from CPU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.config.fields import RecomputeFields
from harness.errors import EXIT_FAILED, EXIT_OK
from harness.estimate.estimate import check_estimable, estimate
from harness.estimate.table import estimate_table
from harness.golden.estimate import estimate_golden_path_for, write_estimate
from harness.golden.store import golden_root, writable
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
        "--golden-dir", metavar="DIR", help="golden root for --write-golden (default: tests/golden)"
    )


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    check_estimable(recipe)
    for row in args.rows or ():
        RecomputeFields.parse(row)
    if args.write_golden and not args.out:
        # refused before measuring: never into an installed package's copy
        writable(golden_root(args.golden_dir))
    try:
        result = estimate(recipe, args.rows, args.attention_backend)
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
    return EXIT_OK
