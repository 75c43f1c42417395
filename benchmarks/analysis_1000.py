"""Benchmark: load, validate and analyse 1,000 run records (target: <= 2 s on the 2-core CI machine).

    ./venv-run python benchmarks/analysis_1000.py [--records 1000]

Records are built with the real constructors (20 iterations, 8 ranks each, like the Moonlight recipe),
written to a temporary directory, then timed end to end: strict load + validation + duplicate checks
+ the matched analysis, as ``recompute-harness analyze DIR`` does it.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from harness.compare.analysis import analyse
from harness.config.fields import RecomputeFields
from harness.config.labels import accepted_labels
from harness.record.build import (
    hardware,
    iteration_row,
    new_record,
    outcome,
    parallelism,
    rank_peaks,
    run_metrics,
    workload,
)
from harness.record.io import load_records, write_record

REVISIONS = {
    "torch": "2.14.1",
    "megatron_core": {"version": "0.19.2", "commit": None, "fingerprint": "0" * 16},
    "megatron_bridge": None,
    "transformer_engine": None,
    "cuda": None,
    "driver": None,
    "python": "3.12",
}
TARGET_S = 2.0


def recompute_rows() -> Iterator[RecomputeFields]:
    """[] first, then distinct ordered label lists (every row differs in the recompute fields alone)."""
    labels = sorted(accepted_labels())  # the installed validator's labels, never a typed-in list
    yield RecomputeFields.selective()
    for size in range(1, len(labels) + 1):
        for modules in itertools.permutations(labels, size):
            yield RecomputeFields.selective(*modules)


def make_records(directory: Path, count: int) -> None:
    for i, fields in enumerate(itertools.islice(recompute_rows(), count)):
        rows = [
            iteration_row(it, step_time_ms=400.0 + i % 97, loss=2.0, tflops_per_gpu=80.0)
            for it in range(1, 21)
        ]
        ranks = [
            rank_peaks(
                r, {it: (30_000_000_000 - i * 1_000_000 + r, 32_000_000_000) for it in range(1, 21)}
            )
            for r in range(8)
        ]
        write_record(
            directory / f"r{i:04d}.json",
            new_record(
                "run",
                record_id=f"bench/{i}",
                revisions=REVISIONS,
                hardware=hardware("H100_80GB", 8, host="bench"),
                workload=workload(
                    recipe="bench",
                    model="bench",
                    backend="mcore",
                    seq_length=4096,
                    micro_batch_size=1,
                    global_batch_size=4,
                    precision="bf16",
                    attention_backend="fused",
                    train_iters=20,
                    parallelism=parallelism(tp=2, ep=8, dp=4),
                ),
                recompute=fields,
                metrics=run_metrics(rows, ranks, (11, 20)),
                outcome=outcome("completed", iteration=20),
            ),
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make_records(Path(tmp), args.records)
        start = time.perf_counter()
        records = load_records([tmp])
        loaded = time.perf_counter()
        analysis = analyse(records)
        done = time.perf_counter()
    print(
        f"{len(records)} records: load+validate {loaded - start:.3f} s, analyse {done - loaded:.3f} s, "
        f"total {done - start:.3f} s (target <= {TARGET_S} s); {sum(r.rank is not None for r in analysis.rows)} ranked"
    )
    return 0 if done - start <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
