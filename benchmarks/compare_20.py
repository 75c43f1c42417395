"""Benchmark: judge a 20-row sweep against its golden, effects included (target: well under 1 s).

    ./venv-run python benchmarks/compare_20.py [--rows 20]

The records are the analysis benchmark's (real constructors, 20 iterations, 8 ranks each); the golden
is written from them by the real refresh path; then ``recompute-harness compare`` is timed end to
end in-process: strict load of records and golden, effects against the [] control, every check,
and the markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from analysis_1000 import make_records

from harness.golden.format import golden_from_records
from harness.golden.judge import compare_records
from harness.golden.store import load_golden, write_golden
from harness.record.io import load_records
from harness.report.markdown import comparison_markdown

TARGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        records_dir, golden_path = Path(tmp) / "records", Path(tmp) / "golden.json"
        records_dir.mkdir()
        make_records(records_dir, args.rows)
        write_golden(
            golden_path, golden_from_records(load_records([records_dir]), {"source": "benchmark"})
        )
        start = time.perf_counter()
        comparison = compare_records(
            load_golden(golden_path), load_records([records_dir]), str(golden_path)
        )
        comparison_markdown(comparison)
        elapsed = time.perf_counter() - start
    print(
        f"{args.rows} rows, {len(comparison.checks)} checks ({'pass' if comparison.passed else 'FAIL'}): "
        f"{elapsed:.3f} s (target < {TARGET_S} s)"
    )
    return 0 if elapsed < TARGET_S and comparison.passed else 1


if __name__ == "__main__":
    sys.exit(main())
