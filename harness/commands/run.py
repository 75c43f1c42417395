"""``recompute-harness run --recipe NAME [--rows ROW...] [--out DIR] [--timeout S]``: a recipe sweep.

One torchrun job per row (the ``[]`` control first), live progress, one run record per row, then the
matched analysis table (and a PNG plot next to the records). Exit 0 when every row completed, 1 when
any row failed (its record says how and where), 2 for bad input (nothing launched).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.files import ensure_dir
from harness.report.json_report import dumps
from harness.report.markdown import analysis_markdown, emit
from harness.report.sweep import sweep_report, sweep_report_json
from harness.run.faults import FAULT_ENV, parse_fault
from harness.run.preflight import read_stack, write_stack
from harness.run.progress import LiveProgress
from harness.run.recipes import load_recipe, recipe_names, with_world
from harness.run.runner import Launcher, check_launchable, run_sweep, sweep_rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipe", help="recipe name (see --list), or the path of a recipe .toml file anywhere"
    )
    parser.add_argument("--list", action="store_true", help="list the recipes and exit")
    parser.add_argument(
        "--rows",
        nargs="+",
        metavar="ROW",
        help="rows to run instead of the recipe's ([] control is always run first), "
        "e.g. moe_act layernorm+moe_act full-uniform-1",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs"), help="directory for the sweep (default: runs)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="R",
        help="run every row R times, each round in rotated order, to judge step time in rounds "
        "against measured noise (default: one job per row, the control first)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="per-row wall-clock limit (default: the recipe's)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        metavar="S",
        help="stop a row when no rank reports progress for S seconds (default: the recipe's)",
    )
    parser.add_argument(
        "--nproc-per-node", type=int, help="override the recipe's ranks per node (re-checked)"
    )
    parser.add_argument(
        "--launcher",
        choices=("local", "slurm"),
        default="local",
        help="local: torchrun per node on this host; slurm: srun + torchrun inside an sbatch "
        "allocation (what `launch --slurm` writes)",
    )
    parser.add_argument(
        "--rdzv-endpoint", metavar="HOST:PORT", help="slurm launcher: the c10d rendezvous endpoint"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the records' place, each row's outcome and the analysis as one JSON object",
    )
    parser.add_argument(
        "--srun-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="slurm launcher: an extra srun flag for every row's step (repeatable), e.g. "
        "--srun-arg=--container-image=IMG; with a container image the ranks run its python",
    )
    stack = parser.add_mutually_exclusive_group()
    stack.add_argument(
        "--preflight-only",
        type=Path,
        metavar="FILE",
        help="run every pre-launch check in this interpreter (inside the ranks' container), write the "
        "stack it saw to FILE and exit, launching nothing (the sbatch script's first step)",
    )
    stack.add_argument(
        "--preflighted",
        type=Path,
        metavar="FILE",
        help="the pre-launch checks ran elsewhere (`--preflight-only FILE` inside the container): "
        "skip them here and require every rank to report FILE's stack",
    )
    parser.add_argument(
        "--inject-fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="test hook, off by default: KIND:iteration=I,phase=P,rank=R[,row=NAME], "
        "KIND one of oom, nan, inf, hang, kill, exit, slow (slow: ms=D more per step from I on)",
    )


def _positive(value: float | None, flag: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a positive, finite number of seconds, got {value}")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in recipe_names():
            recipe = load_recipe(name)
            print(
                f"{name:32} {recipe.backend:6} {recipe.device:4} {recipe.world_size:>3} ranks  {recipe.description}"
            )
        return EXIT_OK
    if not args.recipe:
        raise UsageError("run needs --recipe NAME (or --list)")
    _positive(args.timeout, "--timeout")
    _positive(args.stall_timeout, "--stall-timeout")
    if args.rounds is not None and args.rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {args.rounds}")
    recipe = load_recipe(args.recipe)
    if args.nproc_per_node is not None:
        recipe = with_world(recipe, nproc_per_node=args.nproc_per_node)
    # The environment's fault is the same test hook as --inject-fault: parsed (and refused) here, before
    # anything launches, not first by a worker.
    specs = [*args.inject_fault, *([os.environ[FAULT_ENV]] if os.environ.get(FAULT_ENV) else [])]
    faults = [parse_fault(spec) for spec in specs]

    rows = sweep_rows(recipe, args.rows)
    if args.srun_arg and args.launcher != "slurm":
        raise UsageError("--srun-arg needs --launcher slurm")
    # Inside a container the batch node's interpreter path means nothing: the image's python runs the ranks.
    contained = any(arg.startswith("--container-image") for arg in args.srun_arg)
    launcher = Launcher(
        args.launcher,
        args.rdzv_endpoint,
        "python" if contained else sys.executable,
        tuple(args.srun_arg),
        None if args.preflighted is None else read_stack(args.preflighted, recipe, rows),
    )
    check_launchable(
        recipe, faults, launcher, args.rows
    )  # refuse before the progress table appears
    if args.preflight_only is not None:
        write_stack(args.preflight_only, recipe, rows)
        print(
            f"preflight: {recipe.name} rows {' '.join(rows)} launchable; stack in {args.preflight_only}"
        )
        return EXIT_OK
    ensure_dir(args.out)  # a read-only or file --out is one line before the progress table appears
    with LiveProgress(recipe.name, rows, recipe.train_iters) as progress:  # stop signals: cli.main
        directory, results = run_sweep(
            recipe,
            args.out,
            rows=args.rows,
            faults=faults,
            timeout_s=args.timeout,
            stall_timeout_s=args.stall_timeout,
            progress=progress,
            launcher=launcher,
            checked=True,
            rounds=args.rounds,
        )
    report = sweep_report(directory, results)
    if args.json:
        print(dumps(sweep_report_json(report)))
    else:
        print(f"records: {directory / 'records'}")
        emit(analysis_markdown(report.analysis))
        print(
            f"plot: {report.plot}" if report.plot is not None else f"plot: none ({report.why_not})"
        )
    if report.unwritten is not None:  # after the report: the records and analysis are the product
        raise report.unwritten
    return (
        EXIT_OK if all(result.outcome.status == "completed" for result in results) else EXIT_FAILED
    )
