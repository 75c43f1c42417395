"""``recompute-harness noise RECORD...``: what a sweep in rounds (``run --rounds``) says about step-time
noise: each job's warm-up and within-job noise, each row's job-to-job spread and its effect against
the control of its own round (harness.record.step_time.calibration). ``--json FILE`` keeps it."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import EXIT_OK, UsageError
from harness.files import write_json_atomic
from harness.record.io import load_records
from harness.record.step_time import calibration, in_rounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("records", nargs="+", type=Path, help="run records of a sweep in rounds")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def run(args: argparse.Namespace) -> int:
    records = load_records(args.records)
    if not any(in_rounds(record) for record in records):
        raise UsageError("these records are one job per row: measure noise with run --rounds R")
    figures = calibration(records)
    for label, row in figures["rows"].items():
        if row.get("median_ms") is None:
            print(f"{label}: too few timed iterations for a steady time")
            continue
        effect = (
            ""
            if "effect_pct" not in row
            else f"; vs [] {row['effect_pct']:+.1f} % ± {_pct(row['effect_se_pct'])} s.e."
        )
        print(
            f"{label}: {row['rounds']} rounds, warm-up {row['warmup']} iterations, within-job "
            f"{_pct(max(row['within_job_pct']))} at most, job spread {_pct(row['job_spread_pct'])}, "
            f"between-job {_pct(row['between_job_pct'])}{effect}"
        )
    if args.json is not None:
        write_json_atomic(args.json, figures)
    return EXIT_OK
