"""``recompute-harness probe``: what each recompute label does on real Megatron Core layers, on CPU."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.options import add_golden_dir, add_jobs, require_jobs
from harness.config.revisions import require_identity
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.probe.plan import PRECISIONS, parse_label_sets
from harness.probe.workers.isolate import DEFAULT_HANG_TIMEOUT_S
from harness.report.summary import (
    PassProgress,
    check_report_path,
    default_report_path,
    print_summary,
    write_report,
)

if TYPE_CHECKING:  # the runner imports torch and Megatron Core, which run() defers
    from harness.golden.probe import GoldenLayouts, GoldenStep, LayoutRun
    from harness.probe.runner import ModelProbe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", help="style model to probe (see --list)")
    target.add_argument("--all", action="store_true", help="probe every style model")
    target.add_argument("--list", action="store_true", help="list the style models and exit")
    parser.add_argument(
        "--modules",
        nargs="+",
        metavar="LABELS",
        help="rows to probe against []: label sets (a+b for a combination) and full recompute "
        "rows by name (full-uniform-2, full-block-1-skip-final); default: every label, the skill's "
        "combinations and full recompute",
    )
    parser.add_argument("--seq-length", type=int, help="override the model's sequence length")
    parser.add_argument(
        "--micro-batch-size", type=int, help="override the model's micro-batch size"
    )
    parser.add_argument(
        "--attention-backend",
        choices=("unfused", "fused"),
        default="unfused",
        help="core attention: MCore's local (unfused, keeps the score matrix; default) or a CPU "
        "core attention that keeps what fused/flash attention keeps (q, k, v, output, "
        "softmax statistics)",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=PRECISIONS,
        default=list(PRECISIONS),
        help="parameter and activation dtypes, one pass each (default: all: fp32, where the "
        "bitwise verdicts are read, and bf16, the bytes the GPU recipes keep); each has its own "
        "goldens",
    )
    parser.add_argument(
        "--attribution",
        action="store_true",
        help="also print retained and carried bytes per module",
    )
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="print, instead of the per-model tables, the configuration axes this run covered "
        "(precision, attention back end, MoE dispatcher, TP/PP, method x num_layers, layer kinds), "
        "where each was measured or why not, and per label the passes that measured it",
    )
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument(
        "--pipeline-parallel",
        type=int,
        metavar="N",
        help="probe each stage of an N-stage pipeline of --model under Megatron Core's 1F1B "
        "schedule (N CPU ranks under torchrun): [] and full recompute per stage, with the "
        "micro-batches in flight; each stage has its own goldens (docs/probe-coverage.md)",
    )
    add_jobs(parser)
    layout.add_argument(
        "--tensor-parallel",
        type=int,
        metavar="N",
        help="probe every row of --model on each rank of a TP N group with sequence parallel (N "
        "CPU ranks under torchrun); the ranks must agree, and each precision has its own goldens "
        "(docs/probe-coverage.md)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--details",
        action="store_true",
        help="print every table (per model and precision, unmeasured labels, golden lines) before "
        "the verdict block, instead of writing them to a report file",
    )
    output.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="write every table to FILE (markdown) instead of runs/probe-<time>.md "
        "($RECOMPUTE_HARNESS_REPORT_DIR names another directory)",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=DEFAULT_HANG_TIMEOUT_S,
        metavar="S",
        help="seconds an isolated probe may measure before it is killed and reported as a hang "
        f"(default {DEFAULT_HANG_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--every-layout",
        action="store_true",
        help="with --all: also probe every attention back end and multi-rank layout (PP, TP + SP) "
        "this revision has CPU goldens for; the default with --check-golden on a tree that has no "
        "goldens of its own (an edited tree, a pull request, a patched build), which is judged on "
        "every golden of its version",
    )
    golden = parser.add_mutually_exclusive_group()
    golden.add_argument(
        "--check-golden",
        action="store_true",
        help="compare with the CPU golden of the installed revision (exit 1 on any change)",
    )
    golden.add_argument(
        "--write-golden", action="store_true", help="write the CPU golden from this run"
    )
    add_golden_dir(parser)


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    """Model-size overrides, after refusing nonsense values and combinations."""
    sizes: dict[str, Any] = {}
    for name in ("seq_length", "micro_batch_size"):
        value = getattr(args, name)
        if value is not None:
            if not 1 <= value <= 65536:
                raise UsageError(f"--{name.replace('_', '-')} must be in [1, 65536], got {value}")
            sizes[name] = value
    if sizes and (args.check_golden or args.write_golden):
        raise UsageError(
            "goldens are for the models' own sizes: drop --seq-length/--micro-batch-size"
        )
    if args.modules and (args.check_golden or args.write_golden):
        raise UsageError("goldens cover the full probe matrix: drop --modules")
    if args.every_layout and not args.all:
        raise UsageError(
            "--every-layout goes with --all (a layout of one model: --pipeline-parallel N)"
        )
    if args.every_layout and (sizes or args.modules):
        raise UsageError(
            "--every-layout probes the goldens' own rows and sizes: drop --modules/--seq-length/--micro-batch-size"
        )
    layout = _layout_option(args)
    if layout is not None:
        refused = [
            option
            for option, given in (
                ("--all", args.all),
                ("--list", args.list),
                ("--modules", args.modules),
                ("--seq-length/--micro-batch-size", sizes),
                ("--attribution", args.attribution),
            )
            if given
        ]
        if refused:
            raise UsageError(
                f"{layout} probes one --model at its own sizes: drop {', '.join(refused)}"
            )
    return sizes


def _layout_option(args: argparse.Namespace) -> str | None:
    """The multi-rank layout option given (``--pipeline-parallel`` / ``--tensor-parallel``), if any."""
    if args.pipeline_parallel is not None:
        return "--pipeline-parallel"
    if args.tensor_parallel is not None:
        return "--tensor-parallel"
    return None


def _layout_probes(args: argparse.Namespace, model: str) -> list[ModelProbe]:
    """``model``'s probes on the layout given, every precision from one job: one per pipeline stage
    and precision, or the TP ranks' agreed one per precision."""
    from harness.probe.layouts.pipeline import probe_pipeline
    from harness.probe.layouts.tensor_parallel import probe_tensor_parallel

    options = {
        "precisions": list(dict.fromkeys(args.precision)),
        "attention_backend": args.attention_backend,
    }
    if args.pipeline_parallel is not None:
        return probe_pipeline(model, args.pipeline_parallel, **options)
    return probe_tensor_parallel(model, args.tensor_parallel, **options)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.report is not None:
        if args.json:
            raise UsageError("--report writes the tables, which --json leaves out: drop one")
        check_report_path(args.report)
    if (args.write_golden or args.check_golden) and not args.list:
        require_identity()  # refused before torch and Megatron Core are imported (below)
    # Measured start-up cost: harness.probe / harness.models / harness.golden.probe import torch and
    # Megatron Core (4.0 s, benchmarks/mcore_import.py), which `--help`, parsing and an unpinnable
    # revision's refusal never pay.
    from harness.golden.probe import adapter_drift_lines, golden_step, refuse_unpinnable
    from harness.models import (
        STYLE_MODELS,
        buildable_model,
        buildable_models,
        not_on_this_tree,
        not_probed_lines,
    )
    from harness.probe.layouts.pipeline import check_pipelinable
    from harness.probe.layouts.tensor_parallel import check_tensor_parallel
    from harness.probe.present.axes import coverage
    from harness.probe.present.table import probe_json
    from harness.probe.runner import probe_errors
    from harness.probe.workers.passes import probe_passes
    from harness.report.probe_summary import probe_summary

    if _layout_option(args) is not None:
        # Before the adapter's self-check and any golden directory is touched: nothing is written.
        _sizes(args)
        if args.pipeline_parallel is not None:
            check_pipelinable(buildable_model(args.model), args.pipeline_parallel)
        else:
            check_tensor_parallel(buildable_model(args.model), args.tensor_parallel)
    drift: list[str] = []
    if (args.write_golden or args.check_golden) and not args.list:
        drift = refuse_unpinnable(write=args.write_golden, golden_dir=args.golden_dir)
    if args.list:
        for style in STYLE_MODELS.values():
            missing = not_on_this_tree(style)
            print(
                f"{style.name:<16} {style.description}"
                + (f" [not on this Megatron Core: {missing}]" if missing else "")
            )
        return EXIT_OK
    names = buildable_models() if args.all else [buildable_model(args.model).name]
    require_jobs(args.jobs)
    if not 0 < args.hang_timeout <= 600:
        raise UsageError(f"--hang-timeout must be in (0, 600] seconds, got {args.hang_timeout:g}")
    sizes = _sizes(args)
    label_sets = parse_label_sets(args.modules) if args.modules else None
    if _layout_option(args) is not None:
        try:
            probes = _layout_probes(args, names[0])
        except RuntimeError as exc:  # the ranks failed, hung (and were killed) or disagreed
            print(f"recompute-harness: error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    else:
        layouts = _every_layout(args)
        backends = [args.attention_backend]
        if layouts is not None:
            backends = list(dict.fromkeys([*backends, *layouts.backends]))
        runs = [] if layouts is None else [run for run in layouts.runs if run.model in names]
        try:
            passes = len(names) * len(set(args.precision)) * len(backends)
            with PassProgress("probe passes", passes) as progress:
                probes = probe_passes(
                    names,
                    list(dict.fromkeys(args.precision)),
                    jobs=args.jobs,
                    backends=backends,
                    on_done=lambda probe, done, total: progress.advance(
                        probe.pass_name, done, passes
                    ),
                    label_sets=label_sets,
                    hang_timeout_s=args.hang_timeout,
                    **sizes,
                )
                if runs:
                    probes += _layout_runs(runs)
        except (
            RuntimeError
        ) as exc:  # a worker or rank died or hung (and was killed): nothing written
            print(f"recompute-harness: error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    errors = probe_errors(probes)
    exit_code = EXIT_FAILED if errors else EXIT_OK
    step = None
    if args.write_golden or args.check_golden:
        step = golden_step(
            probes, write=args.write_golden, golden_dir=args.golden_dir, adapter_drift=drift
        )
        if step.differs and args.check_golden:
            exit_code = EXIT_FAILED
    report = None
    if args.json:  # the document alone on stdout; golden lines and the verdict block on stderr
        found = coverage(probes) if args.coverage else [probe_json(p) for p in probes]
        print(json.dumps(found, indent=2))
        if step is not None:
            print("\n".join(adapter_drift_lines(drift) + step.lines()), file=sys.stderr)
    elif args.details:
        print(_details(args, probes, errors, step, drift))
    else:
        report = _write_report(args.report, _details(args, probes, errors, step, drift))
    summary = probe_summary(
        probes,
        command=_command_line(args),
        wall_s=time.monotonic() - started,
        golden=step,
        checking=args.check_golden,
        not_probed=not_probed_lines() if args.all else (),
        adapter_drift=drift,
        report=report,
    )
    print_summary(summary, sys.stderr if args.json else sys.stdout)
    return exit_code


def _layout_runs(runs: list[LayoutRun]) -> list[ModelProbe]:
    """The multi-rank probes a revision has goldens for, one job per layout, model and back end for
    every precision it has goldens at (each job's start-up paid once)."""
    from harness.probe.layouts.pipeline import probe_pipeline
    from harness.probe.layouts.tensor_parallel import probe_tensor_parallel

    jobs: dict[tuple[str, str, int, str], list[str]] = {}
    for run in runs:
        key = (run.layout, run.model, run.ranks, run.attention_backend)
        jobs.setdefault(key, []).append(run.precision)
    probes: list[ModelProbe] = []
    for (layout, model, ranks, backend), precisions in jobs.items():
        launch = probe_pipeline if layout == "pipeline" else probe_tensor_parallel
        probes += launch(model, ranks, precisions=precisions, attention_backend=backend)
    return probes


def _every_layout(args: argparse.Namespace) -> GoldenLayouts | None:
    """The back ends and multi-rank layouts to probe beside the default passes: with --every-layout,
    or judging every model's goldens on a tree that has none of its own (``layouts_to_judge``)."""
    from harness.golden.probe import layouts_to_judge

    if not args.all or not (args.check_golden or args.every_layout):
        return None
    return layouts_to_judge(args.golden_dir, every=args.every_layout)


def _command_line(args: argparse.Namespace) -> str:
    """The probe's defining options, for the block's first line."""
    words = ["probe", "--all"] if args.all else ["probe", "--model", args.model]
    for option, value in (
        ("--pipeline-parallel", args.pipeline_parallel),
        ("--tensor-parallel", args.tensor_parallel),
    ):
        words += [option, str(value)] if value is not None else []
    words += ["--attention-backend", "fused"] if args.attention_backend == "fused" else []
    words += ["--every-layout"] if args.every_layout else []
    words += ["--check-golden"] if args.check_golden else []
    words += ["--write-golden"] if args.write_golden else []
    return shlex.join(words)


def _details(
    args: argparse.Namespace,
    probes: list[ModelProbe],
    errors: list[str],
    step: GoldenStep | None,
    drift: list[str],
) -> str:
    """Everything the probe found, as markdown: the per-model tables (or the coverage), the
    unmeasured labels, the raised rows and every golden line. What ``--details`` prints and the
    report file holds."""
    from harness.golden.probe import adapter_drift_lines
    from harness.models import not_probed_lines
    from harness.probe.present.axes import coverage
    from harness.probe.present.table import (
        attribution_table,
        carried_table,
        coverage_table,
        peaks_table,
        pipeline_table,
        probe_table,
        unmeasured_table,
    )

    parts: list[str] = []
    if args.coverage:
        parts.append(coverage_table(coverage(probes)))
    else:
        for probe in probes:
            parts.append(
                pipeline_table(probe) if probe.pipeline_parallel > 1 else probe_table(probe)
            )
            if args.attribution:
                parts += [attribution_table(probe), carried_table(probe), peaks_table(probe)]
    unmeasured = unmeasured_table(probes)
    parts += [unmeasured] if unmeasured else []
    if args.all and not args.coverage:
        parts += ["\n".join(not_probed_lines())] if not_probed_lines() else []
    if errors:
        parts.append(
            f"{len(errors)} row(s) raised (status error; the rest was probed):\n"
            + "\n".join(f"  {line}" for line in errors)
        )
    if step is not None:
        parts.append("\n".join(adapter_drift_lines(drift) + step.lines()))
    return "\n\n".join(part for part in parts if part)


def _write_report(path: Path | None, details: str) -> str:
    """Write ``details`` to the report file and return its path for the block. A default report that
    cannot be written is said in the block and is no failure; a named one was checked up front."""
    target = path if path is not None else default_report_path("probe")
    try:
        write_report(target, details)
    except UsageError as exc:
        if path is not None:
            raise
        return f"not written ({exc}); --details prints the tables"
    return f"{target} (every table; --details prints them)"
