"""``recompute-harness analyze RECORD... [--estimate FILE] [--json] [--plot PNG]``: the matched table against the [] control."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.compare.analysis import analyse
from harness.errors import EXIT_OK
from harness.estimate.versus import (
    estimate_vs_measured,
    load_estimate,
    versus_json,
    versus_markdown,
)
from harness.files import check_output
from harness.record.io import load_records, unmeasured_rows
from harness.report.json_report import analysis_json, dumps
from harness.report.markdown import analysis_markdown, emit
from harness.report.plot import nothing_to_plot, plot_analysis

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "records", nargs="+", type=Path, help="run record files or directories of them"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the analysis as JSON instead of markdown"
    )
    parser.add_argument(
        "--estimate",
        type=Path,
        metavar="FILE",
        help="also show an `estimate --out` file of the same recipe: estimated vs measured saving per row",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="also write memory saved vs step-time cost against [] as a PNG",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace --plot's file even if it is not a PNG"
    )


def run(args: argparse.Namespace) -> int:
    if (
        args.plot
    ):  # checked before any output: an existing non-PNG (a record, say) is never overwritten
        check_output(args.plot, args.force, lambda head: head.startswith(PNG_MAGIC), "PNG plot")
    analysis = analyse(load_records(args.records))
    analysis.conclusions.extend(
        unmeasured_rows(args.records)
    )  # a killed sweep's table is not the whole sweep
    versus = None
    if args.estimate is not None:
        estimate = load_estimate(args.estimate)
        versus = estimate_vs_measured(analysis, estimate)
    if args.json:
        data = analysis_json(analysis)
        if versus is not None:
            data["estimate_vs_measured"] = versus_json(versus)
        print(dumps(data))
    else:
        emit(analysis_markdown(analysis))
        if versus is not None:
            emit("\n" + versus_markdown(versus, estimate))
    if args.plot:
        reason = nothing_to_plot(analysis)
        if reason is not None:
            print(f"recompute-harness: not plotted: {reason}", file=sys.stderr)
        else:
            plot_analysis(analysis, args.plot)
    return EXIT_OK
