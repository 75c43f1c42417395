"""Wall and CPU time of .ci/run's steps, run exactly as .ci/run runs them (target: the revisions step
within 120 s on the 2-core CI machine, issue "Judge the Megatron Core you are given").

    ./venv-run python benchmarks/ci_steps.py [--steps revisions unreleased] [--repeats N]

Each step's command is read from .ci/run (its ``step "NAME" ...`` line), so the figure is CI's. Prints
per run the wall time, the CPU time of the step's processes (user + system, from the children's
resource usage) and the load average before it started (other work on the machine inflates both).
Exit 1 when a run of a step with a target is over it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS_S = {"revisions": 120.0}


def step_commands() -> dict[str, list[str]]:
    """``step "NAME" COMMAND...`` lines of .ci/run: name -> command words."""
    commands = {}
    for line in (REPO / ".ci" / "run").read_text().splitlines():
        if line.startswith("step "):
            name, *command = shlex.split(line)[1:]
            commands[name] = command
    return commands


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    commands = step_commands()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", nargs="+", default=["revisions"], choices=sorted(commands))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    over = False
    for _ in range(args.repeats):
        for name in args.steps:
            load = os.getloadavg()[0]
            cpu, started = _children_cpu_s(), time.monotonic()
            done = subprocess.run(
                commands[name], cwd=REPO, capture_output=True, text=True, check=False
            )
            wall, cpu = time.monotonic() - started, _children_cpu_s() - cpu
            target = TARGETS_S.get(name)
            verdict = (
                ""
                if target is None
                else f"; target {target:.0f} s: " + ("met" if wall <= target else "OVER")
            )
            over |= target is not None and wall > target
            tail = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
            print(
                f"{name}: exit {done.returncode}, {wall:.1f} s wall, {cpu:.1f} s CPU, "
                f"load {load:.2f} before{verdict} ({tail[0]})",
                flush=True,
            )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
