"""Benchmark of the main job on a tree with no golden of its own (target 150 s on the 2-core CI
machine, warm): ``probe --all --check-golden`` judging every golden of its version (both attention
back ends, the PP 2 and TP 2 + SP probes), against the pinned tree's main job (the default set).

    python benchmarks/every_layout.py [--repeats N]

The edited tree is a copy of the installed Megatron Core with a comment added to a recompute source:
a new fingerprint, the same behaviour, so its run passes ("same behaviour") and is timed whole. One
untimed run of each warms the byte-code caches; then the two are timed alternately (this machine's
speed moves by +-20 % between quiet runs, so an A/B pair is read together). Prints each run's wall
time, exit code and judged line; exits 1 when an edited-tree run is over the target or fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TARGET_S = 150.0


def edited_copy(target: Path) -> Path:
    from harness.config.revisions import megatron_core_root  # finds it without importing it

    core = megatron_core_root()
    if core is None:
        sys.exit("benchmarks/every_layout.py: megatron-core is not installed")
    shutil.copytree(core.parent, target / "megatron", ignore=shutil.ignore_patterns("__pycache__"))
    random_py = target / "megatron" / "core" / "tensor_parallel" / "random.py"
    random_py.write_text(random_py.read_text() + "\n# benchmark: a comment, no behaviour change\n")
    return target


def timed_main_job(tree: Path | None) -> tuple[float, int, str]:
    """(wall seconds, exit code, the block's judged and last lines) of the main job on ``tree``
    (None: the venv's own Megatron Core)."""
    path = [str(tree)] if tree is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "probe", "--all", "--check-golden"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env=env,
        timeout=1800,
    )
    seconds = time.monotonic() - started
    lines = done.stdout.strip().splitlines()
    said = [line for line in lines if line.startswith(("judged ", "goldens "))] + lines[-1:]
    return seconds, done.returncode, "\n".join(said)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each (default 2)")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        tree = edited_copy(Path(scratch))
        for name, where in (("warm-up, pinned", None), ("warm-up, edited", tree)):
            seconds, code, _ = timed_main_job(where)
            print(f"{name}: {seconds:.1f} s, exit {code}", flush=True)
        for repeat in range(args.repeats):
            for name, where in (("pinned tree", None), ("edited tree, every layout", tree)):
                seconds, code, said = timed_main_job(where)
                over = where is not None and (seconds > TARGET_S or code != 0)
                failed = failed or over
                target = f" (target {TARGET_S:.0f} s)" if where is not None else ""
                print(f"== {name} #{repeat + 1}: {seconds:.1f} s{target}, exit {code}\n{said}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
