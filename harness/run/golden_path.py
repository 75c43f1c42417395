"""``python -m harness.run.golden_path RECORDS``: the golden file a sweep's records are judged by
(tests/golden/<recipe>__<device>x<count>__<pins>.json), for ci/nightly-gpu.sh."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.record.golden import golden_filename, hardware_of, pins_of
from harness.record.io import load_records

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "golden"


def golden_path(records_dir: Path, golden_dir: Path = GOLDEN_DIR) -> Path:
    first = load_records([records_dir])[0]
    return golden_dir / golden_filename(first["workload"]["recipe"], hardware_of(first), pins_of(first))


if __name__ == "__main__":
    print(golden_path(Path(sys.argv[1])))
