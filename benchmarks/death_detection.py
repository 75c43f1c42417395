"""Benchmark: how long after a rank dies its row is blamed and stopped (target: <= 5 s on the CPU recipes).

    ./venv-run python benchmarks/death_detection.py [--recipe cpu-moonlight-ep2] [--kinds kill exit]

Each kind is a real fault (harness.run.faults) in the control row of a real torchrun sweep: ``kill``
(rank 1 SIGKILLs itself: torchrun or the runner's process watch notices), ``exit`` (rank 1 exits 0
unreported: only the runner's process watch can tell, the peers would wait for the stall timeout).
Detection time = when the runner had stopped every process and classified the row, minus the dying
rank's last event (written just before the fault fires). The stall timeout is set far above the
target so that a stall-timeout stop cannot pass for a detection.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness.run.events import read_row
from harness.run.faults import parse_fault
from harness.run.recipes import load_recipe
from harness.run.runner import run_sweep

TARGET_S = 5.0
STALL_S = 60.0


def measure(recipe_name: str, kind: str) -> tuple[float, str]:
    recipe = load_recipe(recipe_name)
    fault = parse_fault(f"{kind}:iteration=2,phase=forward,rank=1")
    with tempfile.TemporaryDirectory() as out:
        _, (result,) = run_sweep(
            recipe, Path(out), rows=[], faults=[fault], stall_timeout_s=STALL_S
        )
        classified = time.time()
        died = read_row(result.row_dir, recipe.world_size)[fault.rank].last_time
        outcome = result.outcome
        return (
            classified - died,
            f"{outcome.status} ranks={list(outcome.ranks)} stopped={result.launch.stopped}: {outcome.message}",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="cpu-moonlight-ep2")
    parser.add_argument("--kinds", nargs="+", default=["kill", "exit"], choices=["kill", "exit"])
    args = parser.parse_args(argv)
    worst = 0.0
    for kind in args.kinds:
        seconds, verdict = measure(args.recipe, kind)
        worst = max(worst, seconds)
        print(f"{kind:5} detected and stopped {seconds:5.2f} s after the rank died  [{verdict}]")
    print(
        f"worst {worst:.2f} s (target <= {TARGET_S:g} s): {'OK' if worst <= TARGET_S else 'TOO SLOW'}"
    )
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
