"""Time the full CPU probe matrix of every style model, every precision pass as ``probe --all`` runs
it (target: <= 90 s on the 2-core CI box, the main job's budget).

Run: ./venv-run python benchmarks/probe_matrix.py
Counts everything a user waits for in one process: importing torch + Megatron Core, the gloo group,
every in-process row, and the isolated deadlock probe (which runs in parallel and is killed at its
timeout). Prints the tables, the wall time, and the load average (other jobs on the box inflate it).
"""

from __future__ import annotations

import os
import time

START = time.monotonic()

from harness.models import buildable_models
from harness.probe.plan import PRECISIONS
from harness.probe.runner import probe_models
from harness.probe.table import probe_table

TARGET_S = 90.0


def main() -> int:
    imported = time.monotonic() - START
    probes = [
        probe
        for precision in PRECISIONS
        for probe in probe_models(buildable_models(), precision=precision)
    ]
    elapsed = time.monotonic() - START
    for probe in probes:
        print(probe_table(probe))
        print()
    rows = sum(len(probe.rows) for probe in probes)
    load = os.getloadavg()
    times = os.times()
    cpu_s = times.user + times.system + times.children_user + times.children_system
    print(
        f"probe matrix: {len(probes)} model passes, {rows} rows, {elapsed:.1f} s wall "
        f"(imports {imported:.1f} s), target {TARGET_S:.0f} s: {'PASS' if elapsed <= TARGET_S else 'FAIL'}; "
        f"{cpu_s:.1f} CPU s incl. the isolated child; load average {load[0]:.2f} on {os.cpu_count()} CPUs"
    )
    return 0 if elapsed <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
