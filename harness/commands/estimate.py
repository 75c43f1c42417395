"""``recompute-harness estimate --recipe NAME [--json]``: per-rank retained bytes of each row, from CPU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.files import write_json_atomic
from harness.record.io import read_json


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
    from harness.config.fields import RecomputeFields
    from harness.estimate.estimate import check_estimable, estimate, golden_path
    from harness.run.recipes import load_recipe

    recipe = load_recipe(args.recipe)
    check_estimable(recipe)
    for row in args.rows or ():
        RecomputeFields.parse(row)
    if (
        args.write_golden and not args.out
    ):  # refused before measuring: never into an installed package's copy
        from harness.record.golden_dir import golden_root, writable

        writable(golden_root(args.golden_dir))
    try:
        result = estimate(recipe, args.rows, args.attention_backend)
    except RuntimeError as exc:
        print(f"recompute-harness: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    data = result.as_dict()
    target = (
        Path(args.out)
        if args.out
        else golden_path(result, args.golden_dir)
        if args.write_golden
        else None
    )
    # A golden re-run that measured the same bytes leaves the file alone: only its provenance would differ.
    unchanged = (
        args.write_golden
        and target.is_file()
        and _without_provenance(target)
        == {key: value for key, value in data.items() if key != "provenance"}
    )
    if target is not None and not unchanged:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(target, data)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        from harness.estimate.table import estimate_table

        print(estimate_table(result))
    if target is not None and not args.json:
        print(f"{'unchanged' if unchanged else 'wrote'} {target}")
    return EXIT_OK


def _without_provenance(path: Path) -> dict[str, object] | None:
    """The golden on disk without its provenance; None when it is not readable as one (it is then rewritten)."""
    try:
        data = read_json(path)
    except UsageError:
        return None
    return (
        {key: value for key, value in data.items() if key != "provenance"}
        if isinstance(data, dict)
        else None
    )
