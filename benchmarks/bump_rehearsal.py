"""Wall time of each bump step per revision (the revisions step as CI runs it: benchmarks/ci_steps.py).

Runs the workflow of tests/unit/commands/test_bump*.py (tests/support/bump_workflow.py): megatron-core
overlays (cached, tests/support/overlays.py) shadowing the venv's Megatron Core in a temporary copy of
the repository; prints the wall time of the whole refresh and of each ``bump`` step (identity, labels,
matrix, probe) per revision.

    ./venv-run python benchmarks/bump_rehearsal.py [--versions 0.18.2 0.19.0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from bump_workflow import copy_repo, refresh
from overlays import overlay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=["0.18.2", "0.19.0"])
    args = parser.parse_args()
    for version in args.versions:
        started = time.monotonic()
        mcore = overlay(version)
        installed = time.monotonic() - started
        with tempfile.TemporaryDirectory() as tmp:
            repo = copy_repo(Path(tmp))
            for attempt in ("first", "second"):
                started = time.monotonic()
                done = refresh(repo, mcore)
                total = time.monotonic() - started
                steps = next(
                    (line for line in done.stdout.splitlines() if line.startswith("wall time:")),
                    "?",
                )
                print(
                    f"megatron-core {version} ({attempt} refresh, exit {done.returncode}): {total:.1f} s; "
                    f"overlay {installed:.1f} s; {steps}"
                )
                installed = 0.0


if __name__ == "__main__":
    main()
