"""``recompute-harness bump``: the CPU half of a golden refresh after a Megatron Core bump.

Steps, each timed: the identity of the imported Megatron Core; the label diff against the pinned (or
newest) manifest, then the manifest for this revision; the matrix drift report; one probe (its
passes on ``--jobs`` workers) that prints the per-label diff and writes the CPU goldens. Every write
is idempotent (an unchanged revision writes nothing, byte for byte). A step that cannot run says
why, and the summary lists what was refreshed, what was left and the next step.
``ci/golden-refresh.sh`` runs this, then the GPU half.

Exit: 0 nothing left to fix; 1 drift left (matrix, adapter, labels); 2 the identity is incomplete or
the golden directories are not writable (nothing written).
"""

from __future__ import annotations

import argparse

from harness.commands.options import add_golden_dir, add_jobs, require_jobs
from harness.config.revisions import require_identity
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.files import require_writable_dir
from harness.golden.store import golden_root, labels_dir
from harness.matrix.drift import DEFAULT_CHECK_COUNT
from harness.report.changes import CHANGED_LABEL_LINES, first_change, label_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--count",
        type=int,
        default=DEFAULT_CHECK_COUNT,
        help="configurations the matrix check samples",
    )
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="stop after the matrix check (no CPU goldens are probed or written)",
    )
    add_jobs(parser)
    add_golden_dir(parser)


def run(args: argparse.Namespace) -> int:
    if args.count <= 0:
        raise UsageError("--count must be positive")
    require_jobs(args.jobs)
    # Refused before anything runs or is written: an unidentifiable MCore, unwritable golden dirs.
    require_identity()
    require_writable_dir(labels_dir(golden_root(args.golden_dir)))
    # Measured start-up cost: the bump's steps import torch and Megatron Core (4.0 s,
    # benchmarks/mcore_import.py), which `bump --help` and the refusals above never pay.
    from harness.golden.bump import bump

    summary = bump(args.count, probe=not args.no_probe, golden_dir=args.golden_dir, jobs=args.jobs)
    print("\n== summary (CPU)")
    first = first_change(summary.changes)
    if first is not None:  # what the new revision changed, before what was refreshed
        print(f"first change: {first.line()}")
        print("\n".join(f"  {line}" for line in label_lines(summary.changes, CHANGED_LABEL_LINES)))
    print("\n".join(summary.lines()))
    return EXIT_FAILED if summary.next_steps else EXIT_OK
