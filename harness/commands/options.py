"""Command-line options several subcommands share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from harness.golden.store import ENV_VAR
from harness.record.io import unmeasured_rows


def nonempty_path(value: str) -> Path:
    """A path argument; ``''`` is refused (``Path('')`` is the working directory, never meant)."""
    if not value:
        raise argparse.ArgumentTypeError(
            "an empty path names the working directory; name a directory"
        )
    return Path(value)


def add_golden_dir(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument(
        "--golden-dir",
        type=nonempty_path,
        metavar="DIR",
        help=help_text
        or f"golden root (default: ${ENV_VAR}, else tests/golden of the checkout, else the copy shipped with the package, read-only)",
    )


def note_unmeasured(paths: Iterable[Path]) -> list[str]:
    """Say on stderr which of the named sweeps lack the records of planned rows (a judgement of the rest
    stands, but is not the whole sweep's); the lines, for a report that shows them too."""
    lines = unmeasured_rows(paths)
    for line in lines:
        print(f"recompute-harness: note: {line}", file=sys.stderr)
    return lines
