"""PNG plot of the analysis: peak allocated memory against step time, one point per recompute row."""

from __future__ import annotations

from pathlib import Path

from harness.compare.analysis import Analysis
from harness.files import atomic_path


def plot_analysis(analysis: Analysis, path: Path) -> list[str]:
    """Write the plot atomically; return the labels left out (no step time: failed rows)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI runners
    from matplotlib import pyplot

    placed = [r for r in analysis.rows if r.step_time_ms is not None and r.peak_allocated_gb is not None]
    left_out = [r.label for r in analysis.rows if r not in placed]
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for row in placed:
        marker = "s" if row.verdict == "control" else "o" if row.rank else "x"
        axes.scatter(row.step_time_ms, row.peak_allocated_gb, marker=marker)
        axes.annotate(row.label, (row.step_time_ms, row.peak_allocated_gb), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xlabel("steady-state step time (ms)")
    axes.set_ylabel("peak allocated (GB)")
    title = f"{analysis.model}: recompute rows (square: [] control, dot: ranked, x: not ranked)"
    axes.set_title(title, fontsize=9)
    if left_out:
        figure.text(0.01, 0.01, "not plotted (no steady step time): " + ", ".join(left_out), fontsize=7)
    figure.tight_layout()
    try:
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format="png", dpi=120)
    finally:
        pyplot.close(figure)
    return left_out
