"""Times ``plan --recipe`` end to end for each shipped recipe it models (target: 60 s each on the
2-core machine, docs/plan.md). Run: ``./venv-run python benchmarks/plan_recipes.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

RECIPES = (
    "moonlight-full-8gpu",
    "nemotron-3-nano-full-16gpu",
    "llama3-70b-sft-fp8cs-32gpu",
    "mcore-moonlight-1gpu",
)


def main() -> int:
    for recipe in RECIPES:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "plan", "--recipe", recipe],
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.monotonic() - started
        print(
            f"{recipe}: exit {done.returncode}, {wall:.1f} s wall, "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
