"""Start-up costs a user pays for the glue (targets: ``./venv-run`` with an existing venv adds <= 0.3 s to a
command; the pytest plugin adds <= 1 s to a foreign pytest run's start).

Each is measured as the median of ``--repeat`` runs of the same trivial command with and without the
glue: ``./venv-run true`` against ``true``, and ``pytest --collect-only`` of a one-test foreign project
with the plugin (``-p harness.pytest_plugin``) against without it (``-p no:harness.pytest_plugin``).

    ./venv-run python benchmarks/startup_overhead.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def median_s(command: list[str], repeat: int, cwd: Path) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, cwd=cwd, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    bare = median_s(["true"], args.repeat, ROOT)
    wrapped = median_s([str(ROOT / "venv-run"), "true"], args.repeat, ROOT)
    print(
        f"./venv-run overhead: {wrapped - bare:.3f} s (venv-run true {wrapped:.3f} s, true {bare:.3f} s; target <= 0.3 s)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_one.py").write_text("def test_one():\n    assert True\n")
        pytest = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--collect-only",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            tmp,
        ]
        without = median_s([*pytest, "-p", "no:harness.pytest_plugin"], args.repeat, project)
        with_plugin = median_s([*pytest, "-p", "harness.pytest_plugin"], args.repeat, project)
    print(
        f"pytest plugin start-up overhead: {with_plugin - without:.3f} s "
        f"(with {with_plugin:.3f} s, without {without:.3f} s; target <= 1 s)"
    )


if __name__ == "__main__":
    main()
