"""Command-line options several subcommands share."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.record.golden_dir import ENV_VAR


def nonempty_path(value: str) -> Path:
    """A path argument; ``''`` is refused (``Path('')`` is the working directory, never meant)."""
    if not value:
        raise argparse.ArgumentTypeError("an empty path names the working directory; name a directory")
    return Path(value)


def add_golden_dir(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument("--golden-dir", type=nonempty_path, metavar="DIR",
                        help=help_text or f"golden root (default: ${ENV_VAR}, else tests/golden of the checkout, else the copy shipped with the package, read-only)")
