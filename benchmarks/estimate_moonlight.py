"""Time ``estimate --recipe moonlight-full-8gpu`` end to end (target: <= 60 s, <= 8 GB, 2-core box).

Run: ./venv-run python benchmarks/estimate_moonlight.py
Everything a user waits for: the command's start, torchrun, both TP ranks importing torch + Megatron
Core, building Moonlight's dense and 64-expert MoE layers at their per-rank widths, every row at three
sequence lengths, the fit. Memory is the peak of the summed RSS of the whole process tree (both ranks
hold their layer at once), sampled every 0.1 s. Prints the load average: other jobs inflate the time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TARGET_S = 60.0
TARGET_BYTES = 8 * 1024**3
RECIPE = "moonlight-full-8gpu"


def _tree_rss(root: int) -> int:
    """Summed resident bytes of ``root`` and all its descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    total = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def main() -> int:
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "estimate", "--recipe", RECIPE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(child.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = child.communicate()
    elapsed = time.monotonic() - start
    done.set()
    sampler.join()
    print(stdout)
    if child.returncode != 0:
        print(stderr, file=sys.stderr)
        return 1
    load = os.getloadavg()
    ok = elapsed <= TARGET_S and peak <= TARGET_BYTES
    print(
        f"estimate {RECIPE}: {elapsed:.1f} s wall (target {TARGET_S:.0f} s), peak tree RSS "
        f"{peak / 1024**3:.2f} GiB (target {TARGET_BYTES / 1024**3:.0f} GiB): {'PASS' if ok else 'FAIL'}; "
        f"load average {load[0]:.2f} on {os.cpu_count()} CPUs"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
