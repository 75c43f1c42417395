"""Wall and CPU time of .ci/run's steps, run exactly as .ci/run runs them (target: the revisions step
within 120 s on the 2-core CI machine, issue "Judge the Megatron Core you are given").

    ./venv-run python benchmarks/ci_steps.py [--steps revisions unreleased] [--repeats N]

Each step's command is read from .ci/run (its ``step "NAME" ...`` line), so the figure is CI's. Prints
per run the wall time, the CPU time of the step's processes (user + system, from the children's
resource usage) and the load average before it started (other work on the machine inflates both).
This machine's speed moves by ±20 % between quiet runs (a whole probe took 88 s and 104 s of CPU five
minutes apart): before each run, a reference (``probe --model moonlight-tiny --precision bf16``, the
same kind of work) is timed, and the step's CPU is also given in reference runs, a figure the
machine's speed moves less. Exit 1 when a run of a step with a target is over it.
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
REFERENCE = [
    sys.executable,
    "-m",
    "harness.cli",
    "probe",
    "--model",
    "moonlight-tiny",
    "--precision",
    "bf16",
]


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


def _cpu_of(command: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``command`` in the repository: its result, wall seconds and CPU seconds (its processes)."""
    cpu, started = _children_cpu_s(), time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    return done, time.monotonic() - started, _children_cpu_s() - cpu


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
            reference, _, reference_cpu = _cpu_of(REFERENCE)
            if reference.returncode != 0:
                print(f"the reference probe failed: {reference.stderr.strip()[-500:]}")
                return 1
            done, wall, cpu = _cpu_of(commands[name])
            target = TARGETS_S.get(name)
            verdict = (
                ""
                if target is None
                else f"; target {target:.0f} s: " + ("met" if wall <= target else "OVER")
            )
            over |= target is not None and wall > target
            tail = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
            print(
                f"{name}: exit {done.returncode}, {wall:.1f} s wall, {cpu:.1f} s CPU "
                f"({cpu / reference_cpu:.1f} reference runs of {reference_cpu:.1f} s), "
                f"load {load:.2f} before{verdict} ({tail[0]})",
                flush=True,
            )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
