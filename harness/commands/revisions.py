"""``recompute-harness revisions [--json]``: the software identity goldens are pinned to."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.config.revisions import collect_revisions, fingerprint_sources, megatron_core_identity
from harness.errors import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the run record's revisions block as JSON"
    )


def _line(value: object) -> str:
    if value is None:
        return "absent"
    if isinstance(value, dict):
        return "  ".join(f"{key}={'-' if item is None else item}" for key, item in value.items())
    return str(value)


def run(args: argparse.Namespace) -> int:
    revisions = collect_revisions()
    if args.json:
        print(json.dumps(revisions, indent=2))
        return EXIT_OK
    for key, value in revisions.items():
        print(f"{key:<19} {_line(value)}")
    identity = megatron_core_identity()
    if identity["root"] is not None:
        sources = fingerprint_sources(Path(identity["root"]))
        print(f"{'imported from':<19} {identity['root']}")
        print(f"{'fingerprint over':<19} {len(sources)} files: {', '.join(sources)}")
    for note in identity["notes"]:
        print(f"{'note':<19} {note}")
    return EXIT_OK
