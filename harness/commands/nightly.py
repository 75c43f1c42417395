"""``recompute-harness nightly``: what the nightly GPU tier compares (harness/golden/nightly.py).

``--list``: ``CASE GOLDEN`` per case (``-`` where no golden is pinned to the installed stack);
``--recipes``: the cases' recipes, one a line (ci/golden-refresh.sh's default); ``--judge RECORDS``:
how ci/nightly-gpu.sh judges a sweep's records, ``exact GOLDEN`` or ``effects GOLDEN`` (a seed study
on other pins), else exit 1 with the one line naming the case, the pins and the refresh command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import EXIT_FAILED, EXIT_OK
from harness.golden.nightly import NIGHTLY_CASES, judgement, listing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="each case and its golden (CASE GOLDEN)")
    what.add_argument("--recipes", action="store_true", help="the cases' recipes, one a line")
    what.add_argument(
        "--judge",
        type=Path,
        metavar="RECORDS",
        help="how a sweep's records are judged: exact GOLDEN, effects GOLDEN, or exit 1 saying why",
    )


def run(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(listing()))
    elif args.recipes:
        print("\n".join(case.recipe for case in NIGHTLY_CASES))
    else:
        how, what = judgement(args.judge)
        print(what if how == "missing" else f"{how} {what}")
        return EXIT_FAILED if how == "missing" else EXIT_OK
    return EXIT_OK
