"""``recompute-harness labels``: the recompute labels the installed validator accepts, and their manifest."""

from __future__ import annotations

import argparse
import json

from harness.commands.options import add_golden_dir
from harness.config.labels import accepted_labels
from harness.config.revisions import collect_revisions
from harness.errors import EXIT_FAILED, EXIT_OK
from harness.golden.labels import manifest_verdict, write_manifest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--json", action="store_true", help="print fingerprint and labels as JSON")
    action.add_argument(
        "--write-manifest",
        action="store_true",
        help="pin the labels for this fingerprint in the golden root's labels/",
    )
    action.add_argument(
        "--check", action="store_true", help="compare the labels with the pinned manifest"
    )
    add_golden_dir(parser)


def run(args: argparse.Namespace) -> int:
    if args.write_manifest:
        path, written = write_manifest(args.golden_dir)
        print(f"{'wrote' if written else 'unchanged'} {path}")
        return EXIT_OK
    if args.check:
        line, changed = manifest_verdict(args.golden_dir)
        print(line)
        return EXIT_FAILED if changed else EXIT_OK
    labels = sorted(accepted_labels())
    if args.json:
        fingerprint = collect_revisions()["megatron_core"]["fingerprint"]
        print(json.dumps({"fingerprint": fingerprint, "labels": labels}, indent=2))
    else:
        print("\n".join(labels))
    return EXIT_OK
