"""PNG plot of the analysis: the trade-off against the ``[]`` control at a glance.

Memory saved (% of the control's allocated peak) against step-time cost (% of the control's step
time), one point per row, labelled with the absolute figures (GB saved, ms per step); the Pareto
front through the ranked rows, numbered in ranked order; rows that failed (plain or advanced-but-
failed) on a strip at the right edge, at the saving their checkpoint shows, with their stage. A CPU
sweep has no device peaks: it plots step-time cost alone. Everything comes from the analysis rows,
so the picture and its footnote say what the table says.
"""

from __future__ import annotations

from pathlib import Path

from harness.compare.analysis import Analysis, Row, ranked_rows
from harness.files import atomic_path


def _saving_pct(row: Row) -> float | None:
    return None if row.allocated_vs_control_pct is None else -row.allocated_vs_control_pct


def nothing_to_plot(analysis: Analysis) -> str | None:
    """Why the analysis has nothing to draw (one line), or None."""
    others = [row for row in analysis.rows if row.verdict != "control"]
    if not others:
        return "only the [] control was measured: nothing to compare it with"
    if all(_saving_pct(row) is None and row.time_vs_control_pct is None for row in others):
        return "no row has a peak or a steady step time comparable with the control's (see the table's notes)"
    return None


def _control_row(analysis: Analysis) -> Row:
    return next(row for row in analysis.rows if row.verdict == "control")


def _gb_ms(row: Row, control: Row) -> str:
    parts = []
    if (
        row.peak_allocated_gb is not None
        and control.peak_allocated_gb is not None
        and _saving_pct(row) is not None
    ):
        parts.append(f"{control.peak_allocated_gb - row.peak_allocated_gb:+.2f} GB saved")
    if (
        row.step_time_ms is not None
        and control.step_time_ms is not None
        and row.time_vs_control_pct is not None
    ):
        parts.append(f"{row.step_time_ms - control.step_time_ms:+.1f} ms")
    return ", ".join(parts)


def plot_analysis(analysis: Analysis, path: Path) -> list[str]:
    """Write the plot atomically (call only when ``nothing_to_plot`` is None); return the rows left
    out, each with the reason the footnote gives."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI runners
    from matplotlib import pyplot

    control = _control_row(analysis)
    rows = [row for row in analysis.rows if row.verdict != "control"]
    has_memory = any(_saving_pct(row) is not None for row in rows)
    figure, axes = pyplot.subplots(figsize=(8, 5))
    left_out: list[str] = []
    if has_memory:
        placed = [
            row
            for row in rows
            if row.verdict == "pass"
            and _saving_pct(row) is not None
            and row.time_vs_control_pct is not None
        ]
        failed = [
            row
            for row in rows
            if row.verdict in ("failed", "advanced-but-failed") and _saving_pct(row) is not None
        ]
        # Every placed row has a step-time cost (the filter above); this narrows it for the checker.
        times = [cost for row in placed if (cost := row.time_vs_control_pct) is not None]
        axes.scatter([0.0], [0.0], marker="s", color="black", label="[] control")
        for row in placed:
            marker, color = ("o", "tab:green") if row.rank else ("x", "tab:gray")
            axes.scatter(row.time_vs_control_pct, _saving_pct(row), marker=marker, color=color)
            text = f"{'#' + str(row.rank) + ' ' if row.rank else ''}{row.label} ({_gb_ms(row, control)})"
            axes.annotate(
                text,
                (row.time_vs_control_pct, _saving_pct(row)),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
        front = [row for _, row in ranked_rows(placed)]
        if front:
            axes.plot(
                [0.0, *(r.time_vs_control_pct for r in front)],
                [0.0, *(_saving_pct(r) for r in front)],
                color="tab:green",
                linewidth=1,
                label="Pareto front (ranked)",
            )
        if failed:
            edge = max([0.0, *times]) * 1.15 + 1.0
            for row in failed:
                axes.scatter(edge, _saving_pct(row), marker="v", color="tab:red")
                axes.annotate(
                    f"{row.label}: {row.stage} ({row.verdict})",
                    (edge, _saving_pct(row)),
                    textcoords="offset points",
                    xytext=(-4, 4),
                    fontsize=7,
                    ha="right",
                    color="tab:red",
                )
            axes.axvline(edge, color="tab:red", linewidth=0.5, linestyle=":")
        shown = {row.label for row in placed + failed}
        left_out = [
            f"{row.label} ({row.note or row.stage})" for row in rows if row.label not in shown
        ]
        axes.set_xlabel(
            "step-time cost vs [] (%)  —  failed rows at the right edge, at their checkpoint"
        )
        axes.set_ylabel("allocated memory saved vs [] (%)")
        right = max([1.0, *times])
        axes.set_xlim(
            left=min([0.0, *times]) - 0.5,
            right=max(axes.get_xlim()[1], right * 1.6),
        )  # room for the labels
        axes.legend(fontsize=7, loc="center right")
    else:  # CPU sweep: no caching-allocator peaks, only step times
        timed = [row for row in rows if row.time_vs_control_pct is not None]
        axes.barh(
            [row.label for row in timed],
            [row.time_vs_control_pct for row in timed],
            color="tab:blue",
        )
        axes.set_xlabel("step-time cost vs [] (%)  —  no device memory peaks in these records")
        left_out = [f"{row.label} ({row.note or row.stage})" for row in rows if row not in timed]
    axes.axhline(0.0, color="black", linewidth=0.5)
    axes.set_title(
        f"{analysis.model} ({analysis.recipe}) on {analysis.hardware}\n{analysis.revisions}",
        fontsize=9,
    )
    if left_out:
        figure.text(0.01, 0.01, "not plotted: " + "; ".join(left_out), fontsize=6, wrap=True)
    figure.tight_layout(rect=(0, 0.04 if left_out else 0, 1, 1))
    try:
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format="png", dpi=120)
    finally:
        pyplot.close(figure)
    return left_out
