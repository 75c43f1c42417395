"""What ``run`` reports once a sweep ends: its records' place, the analysis against the ``[]`` control,
and the plot drawn next to the records (when there is something to plot and it can be written)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.compare.analysis import Analysis, analyse
from harness.errors import UsageError
from harness.record.step_time import first_round
from harness.report.json_report import analysis_json
from harness.report.plot import nothing_to_plot, plot_analysis
from harness.run.runner import RowResult

PLOT_NAME = "analysis.png"


@dataclass(frozen=True)
class SweepReport:
    directory: Path
    results: Sequence[RowResult]
    analysis: Analysis
    plot: Path | None  # None: not drawn, for ``why_not``
    why_not: str | None
    unwritten: UsageError | None  # the plot's write failure, raised once the report is printed


def sweep_report(directory: Path, results: Sequence[RowResult]) -> SweepReport:
    """Analyse the sweep's records and draw their plot. A plot that cannot be drawn (only the control
    measured) or written (a disk that filled as the sweep ended) is kept as a reason, so it never hides
    the records and the analysis, which are the sweep's product."""
    # A sweep in rounds is analysed by its first round (step time in rounds is compare's to judge).
    analysis = analyse(first_round([result.record for result in results]))
    plot: Path | None = None
    unwritten: UsageError | None = None
    why_not = nothing_to_plot(analysis)
    if why_not is None:
        try:
            plot_analysis(analysis, directory / PLOT_NAME)
            plot = directory / PLOT_NAME
        except UsageError as exc:
            unwritten, why_not = exc, "could not be written"
    return SweepReport(directory, results, analysis, plot, why_not, unwritten)


def sweep_report_json(report: SweepReport) -> dict[str, Any]:
    return {
        "records": str(report.directory / "records"),
        "plot": None if report.plot is None else str(report.plot),
        "rows": [
            {
                "row": result.row,
                "status": result.outcome.status,
                "record": str(result.record_path),
            }
            for result in report.results
        ],
        "analysis": analysis_json(report.analysis),
    }
