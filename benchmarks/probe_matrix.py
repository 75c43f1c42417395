"""Time the full CPU probe matrix of every style model, every precision pass as ``probe --all`` runs
it (target: <= 90 s on the 2-core CI box, the main job's budget).

Run: ./venv-run python benchmarks/probe_matrix.py [--jobs N]
Counts everything a user waits for: importing torch + Megatron Core, the gloo group, every row, and
the isolated deadlock probe (which runs in parallel and is killed at its timeout); the passes run on
``--jobs`` worker processes as ``probe --all`` runs them (default: the usable cores; 1: one process).
Prints the tables, the wall time, the CPU time of this process and its children, and the load
average (other jobs on the box inflate it).
"""

from __future__ import annotations

import argparse
import os
import time

START = time.monotonic()

from harness.models import buildable_models
from harness.probe.plan import PRECISIONS
from harness.probe.present.table import probe_table
from harness.probe.workers.passes import probe_passes
from harness.processes import usable_cores

TARGET_S = 90.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=usable_cores())
    jobs = parser.parse_args().jobs
    imported = time.monotonic() - START
    probes = probe_passes(buildable_models(), PRECISIONS, jobs=jobs)
    elapsed = time.monotonic() - START
    for probe in probes:
        print(probe_table(probe))
        print()
    rows = sum(len(probe.rows) for probe in probes)
    load = os.getloadavg()
    times = os.times()
    cpu_s = times.user + times.system + times.children_user + times.children_system
    print(
        f"probe matrix: {len(probes)} model passes on {jobs} job(s), {rows} rows, {elapsed:.1f} s wall "
        f"(imports {imported:.1f} s), target {TARGET_S:.0f} s: {'PASS' if elapsed <= TARGET_S else 'FAIL'}; "
        f"{cpu_s:.1f} CPU s incl. workers and the isolated child; load average {load[0]:.2f} on {os.cpu_count()} CPUs"
    )
    return 0 if elapsed <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
