"""``recompute-harness analyze RECORD... [--json] [--plot PNG]``: the matched table against the [] control."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.compare.analysis import analyse
from harness.errors import EXIT_OK
from harness.record.io import load_records
from harness.report.json_report import analysis_json, dumps
from harness.report.markdown import analysis_markdown, emit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("records", nargs="+", type=Path, help="run record files or directories of them")
    parser.add_argument("--json", action="store_true", help="print the analysis as JSON instead of markdown")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also write memory saved vs step-time cost against [] as a PNG")


def run(args: argparse.Namespace) -> int:
    analysis = analyse(load_records(args.records))
    if args.json:
        print(dumps(analysis_json(analysis)))
    else:
        emit(analysis_markdown(analysis))
    if args.plot:
        from harness.report.plot import nothing_to_plot, plot_analysis

        reason = nothing_to_plot(analysis)
        if reason is not None:
            print(f"recompute-harness: not plotted: {reason}", file=sys.stderr)
        else:
            plot_analysis(analysis, args.plot)
    return EXIT_OK
