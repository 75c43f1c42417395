"""What the carried-memory measurement adds to the CPU probe matrix (target: <= 20 %).

Run: ./venv-run python benchmarks/carried_overhead.py [--repeats N]
Runs every in-process row of the three style models with the carried-memory measurement
(harness.probe.measurement.carried: a second step, a young-generation scan, the holder walk) and without it
(``measure_carried`` replaced by one returning nothing, so the second step is not run), alternating,
in one process (imports and the gloo group paid once). The isolated deadlock row is left out: it runs
in parallel under a fixed timeout and would only dilute the figure. Prints both wall times, the
overhead and the load average (other jobs on the box inflate both sides).
"""

from __future__ import annotations

import argparse
import os
import time

from harness.models import buildable_models
from harness.probe.measurement import measure
from harness.probe.measurement.carried import Carried
from harness.probe.runner import probe_models

TARGET = 0.20


def _timed(with_carried: bool) -> float:
    original = measure.measure_carried
    if not with_carried:
        measure.measure_carried = lambda module, step, excluded: Carried()
    try:
        started = time.monotonic()
        probe_models(buildable_models(), hang_probe=False)
        return time.monotonic() - started
    finally:
        measure.measure_carried = original


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    _timed(False)  # warm: first builds, lazily imported MCore modules
    with_carried, without = [], []
    for _ in range(args.repeats):
        without.append(_timed(False))
        with_carried.append(_timed(True))
    on, off = min(with_carried), min(without)
    overhead = on / off - 1
    print(
        f"probe matrix (in-process rows): {off:.1f} s without the carried measurement, {on:.1f} s with it: "
        f"{overhead * 100:+.1f} % (target <= {TARGET * 100:.0f} %: {'PASS' if overhead <= TARGET else 'FAIL'}); "
        f"best of {args.repeats}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    return 0 if overhead <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
