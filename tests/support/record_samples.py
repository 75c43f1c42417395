"""Run records for tests, built with the real constructors (harness.record.build) from small numbers."""

from __future__ import annotations

from harness.cli import main
from harness.config.fields import RecomputeFields
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
from harness.record.io import write_record, write_sweep_plan
from harness.record.model import Record

REVISIONS = {
    "torch": "2.14.1",
    "megatron_core": {"version": "0.19.2", "commit": None, "fingerprint": "feedfacecafebeef"},
    "megatron_bridge": None,
    "transformer_engine": None,
    "cuda": "13.0",
    "driver": None,
    "python": "3.12.1",
}


def run_record(
    *modules: str,
    peak: int = 30_000_000_000,
    step_ms: float = 400.0,
    status: str = "completed",
    iterations: int = 6,
    died_in: int | None = None,
    revisions: dict | None = None,
    model: str = "tiny",
    gpus: int = 2,
    record_id: str | None = None,
    growth_after: int | None = None,
    environment: dict[str, str] | None = None,
) -> Record:
    """A completed run (or one that failed in the forward of iteration ``died_in``), one row per rank.
    ``growth_after``: the peaks grow by 1 GB after that iteration (a pool allocated later in the run)."""
    if status == "completed":
        done = iterations
    else:
        died_in = iterations if died_in is None else died_in
        done = died_in - 1
    rows = [
        iteration_row(i, step_time_ms=step_ms, loss=2.0, tflops_per_gpu=100.0)
        for i in range(1, done + 1)
    ]
    grown = [
        peak + (10**9 if growth_after is not None and i > growth_after else 0)
        for i in range(done + 1)
    ]
    ranks = [
        rank_peaks(r, {i: (grown[i] - 1000 * r, grown[i] + 10**9) for i in range(1, done + 1)})
        for r in range(gpus)
    ]
    return new_record(
        "run",
        record_id=record_id,
        revisions=revisions or REVISIONS,
        hardware=hardware("H100_80GB", gpus, sm="9.0", host="node-1"),
        workload=workload(
            recipe="tiny-recipe",
            model=model,
            backend="mcore",
            seq_length=128,
            micro_batch_size=1,
            global_batch_size=2,
            precision="bf16",
            attention_backend="fused",
            train_iters=iterations,
            parallelism=parallelism(dp=gpus),
            environment=environment,
        ),
        recompute=RecomputeFields.selective(*modules),
        metrics=run_metrics(rows, ranks, (3, done) if status == "completed" else None),
        outcome=outcome(
            status,
            iteration=iterations if status == "completed" else died_in,
            phase=None if status == "completed" else "forward",
        ),
    )


def run_json(*modules: str, **kwargs) -> dict:
    """``run_record`` as it is written to disk (for tests that edit or serialise the JSON itself)."""
    return run_record(*modules, **kwargs).to_json()


PROVENANCE = {
    "source": "test",
    "command": "pytest",
    "host": "h",
    "date": "d",
    "gpu": "2x H100_80GB",
    "driver": None,
}


def write_records(tmp_path, *records) -> list[str]:
    """Write ``records`` under ``tmp_path/records``; their paths, for the command line."""
    paths = []
    for i, record in enumerate(records):
        path = tmp_path / "records" / f"r{i}.json"
        write_record(path, record)
        paths.append(str(path))
    return paths


def refresh(tmp_path, *records, flags=()) -> int:
    """``golden refresh`` of ``records`` into ``tmp_path/golden`` (the exit code)."""
    return main(
        [
            "golden",
            "refresh",
            "--golden-dir",
            str(tmp_path / "golden"),
            *flags,
            *write_records(tmp_path, *records),
        ]
    )


def write_sweep(directory, planned: dict[str, Record | None]):
    """A sweep directory as the runner leaves it: the plan of every row of ``planned`` (row -> its record, or
    None for a row the runner never got to record), and the records that were written. The directory."""
    files = {row: f"records/r{i}.json" for i, row in enumerate(planned)}
    write_sweep_plan(directory, "tiny-recipe", files)
    for row, record in planned.items():
        if record is not None:
            write_record(directory / files[row], record)
    return directory
