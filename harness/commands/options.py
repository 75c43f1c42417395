"""Command-line options several subcommands share."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.record.golden_dir import ENV_VAR


def add_golden_dir(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument("--golden-dir", type=Path, metavar="DIR",
                        help=help_text or f"golden root (default: ${ENV_VAR}, else tests/golden of the checkout, else the copy shipped with the package, read-only)")
