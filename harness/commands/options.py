"""Command-line options several subcommands share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from harness.errors import UsageError
from harness.golden.store import ENV_VAR
from harness.processes import usable_cores
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


def add_jobs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs",
        type=int,
        default=usable_cores(),
        metavar="N",
        help="probe passes (a model at a precision) run at once, each on a worker process of its "
        f"own (default: the usable cores, {usable_cores()} here; 1: every pass in this process, "
        "the cheaper choice when other CPU-heavy work shares the cores)",
    )


def require_jobs(jobs: int) -> None:
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")


def note_unmeasured(paths: Iterable[Path]) -> list[str]:
    """Say on stderr which of the named sweeps lack the records of planned rows (a judgement of the rest
    stands, but is not the whole sweep's); the lines, for a report that shows them too."""
    lines = unmeasured_rows(paths)
    for line in lines:
        print(f"recompute-harness: note: {line}", file=sys.stderr)
    return lines
