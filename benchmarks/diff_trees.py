"""Benchmark (and rehearsal) of ``recompute-harness diff A B``: target 90 s for two trees on the 2-core
CI machine (both sides' probes run at once, one per core).

    python benchmarks/diff_trees.py                 # the venv's Megatron Core vs the development head
    python benchmarks/diff_trees.py --pr 4921 5293  # each pull request: its merge-base vs its head

Trees are clean Megatron-LM work trees made from ``$MEGATRON_LM_GIT`` (tests/support/overlays.py).
Prints, per diff, the wall time, the exit code and the diff's report; exits 1 when a diff ran past
the target or was refused.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from overlays import megatron_lm_tree, pull_request_trees

TARGET_S = 90.0


def timed_diff(a: Path, b: Path) -> tuple[float, int, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "diff", str(a), str(b)],
        capture_output=True,
        text=True,
        check=False,
    )
    return time.monotonic() - started, done.returncode, done.stdout + done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pr", type=int, nargs="+", default=[], help="pull request numbers")
    args = parser.parse_args()
    if args.pr:
        pairs = [(f"#{number}", *pull_request_trees(number)) for number in args.pr]
    else:
        import megatron.core

        installed = Path(megatron.core.__file__).resolve().parents[2]
        pairs = [("installed vs head", installed, megatron_lm_tree())]
    worst = 0.0
    refused = False
    for name, a, b in pairs:
        seconds, code, report = timed_diff(a, b)
        worst = max(worst, seconds)
        refused = refused or code == 2
        print(f"== {name}: {seconds:.1f} s, exit {code} (target {TARGET_S:.0f} s)\n{report}")
    return 1 if worst > TARGET_S or refused else 0


if __name__ == "__main__":
    sys.exit(main())
