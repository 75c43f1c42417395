"""``recompute-harness diff A B``: labels, rules and probe values that differ between two Megatron Core
trees (directories holding ``megatron/core``). Exit 0 same behaviour, 1 changed, 2 refused."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.errors import EXIT_FAILED, EXIT_OK
from harness.report.summary import print_summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "a", type=Path, help="the reference tree: a directory holding megatron/core"
    )
    parser.add_argument("b", type=Path, help="the tree to judge: a directory holding megatron/core")
    parser.add_argument(
        "--attention-backend",
        choices=("unfused", "fused"),
        default="unfused",
        help="core attention of the probe on both sides (as in probe)",
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="probe only this style model (repeatable; default: every one; see probe --list)",
    )
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")


def run(args: argparse.Namespace) -> int:
    from harness.compare.tree_diff import diff_trees
    from harness.report.verdicts import diff_summary

    started = time.monotonic()
    found = diff_trees(args.a, args.b, args.attention_backend, args.model)
    print(json.dumps(found.to_json(), indent=2) if args.json else "\n".join(found.lines()))
    # The block last, for people (on stderr beside --json: stdout stays one JSON document).
    summary = diff_summary(found, wall_s=time.monotonic() - started)
    print_summary(summary, sys.stderr if args.json else sys.stdout)
    return EXIT_FAILED if found.changed else EXIT_OK
