"""Markdown tables for comparisons, analyses, selections, golden refresh diffs and the matrix listing.

``emit`` prints to the terminal and, in GitHub Actions, appends the same text to the job summary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from harness.compare.analysis import GB, Analysis
from harness.compare.selection import Selection
from harness.config.rule import VALIDATOR
from harness.config.rules import RULES
from harness.errors import UsageError
from harness.golden.judge import Comparison
from harness.record.metrics import MetricName, unit_of


def emit(markdown: str) -> None:
    """Print ``markdown``; append it to ``$GITHUB_STEP_SUMMARY`` when that is set."""
    print(markdown)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8", errors="backslashreplace") as handle:
                handle.write(markdown + "\n\n")
        except OSError as exc:
            raise UsageError(
                f"$GITHUB_STEP_SUMMARY {summary}: cannot append: {exc.strerror}"
            ) from None


def format_value(metric: str, value: Any) -> str:
    """Bytes as decimal GB (as the skill card writes them), floats to 2 decimals, null as a dash."""
    if value is None:
        return "–"
    if unit_of(metric) == "bytes" and isinstance(value, (int, float)):
        return f"{value / GB:.3f} GB"
    if unit_of(metric) == "%" and isinstance(value, (int, float)):
        return f"{value:+.2f}%"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}%"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _difference(metric: str, check_delta_pct: float | None, difference: float | None) -> str:
    """Percentages differ in percentage points, savings in bytes, everything else in % of the golden."""
    unit = unit_of(metric)
    if difference is not None and unit == "%":
        return f"{difference:+.2f} pp"
    if difference is not None and unit == "bytes" and metric.startswith("saving_"):
        return f"{difference / 1e6:+.0f} MB"
    return _pct(check_delta_pct)


def comparison_markdown(comparison: Comparison) -> str:
    verdict = "PASS" if comparison.passed else f"FAIL ({len(comparison.failures)} check(s))"
    rows = [
        (
            c.label,
            c.metric,
            format_value(c.metric, c.golden),
            format_value(c.metric, c.actual),
            _difference(c.metric, c.delta_pct, c.difference),
            c.tolerance,
            c.verdict,
        )
        for c in comparison.checks
    ]
    return (
        f"### Golden check {comparison.recipe}: {verdict}\n\ngolden: `{comparison.golden_path}`\n\n"
        + (f"**{comparison.effect_only}**\n\n" if comparison.effect_only else "")
        + table(("row", "metric", "golden", "actual", "Δ", "tolerance", "verdict"), rows)
    )


def analysis_markdown(analysis: Analysis) -> str:
    rows = [
        (
            r.label,
            r.verdict + (f" #{r.rank}" if r.rank else ""),
            r.stage,
            "–" if r.peak_allocated_gb is None else f"{r.peak_allocated_gb:.3f}",
            "–" if r.peak_after_iteration is None else str(r.peak_after_iteration),
            "–" if r.peak_reserved_gb is None else f"{r.peak_reserved_gb:.3f}",
            format_value(MetricName.STEP_TIME_MS, r.step_time_ms),
            format_value(MetricName.TFLOPS_PER_GPU, r.tflops_per_gpu),
            _pct(r.allocated_vs_control_pct),
            _pct(r.time_vs_control_pct),
            r.note,
        )
        for r in analysis.rows
    ]
    header = (
        "recompute",
        "verdict",
        "outcome",
        "peak allocated (GB)",
        "after it.",
        "peak reserved (GB)",
        "step time (ms)",
        "TFLOP/s/GPU",
        "allocated vs []",
        "time vs []",
        "note",
    )
    conclusions = "\n".join(f"- {line}" for line in analysis.conclusions)
    return f"### Recompute analysis: {analysis.model} ({analysis.recipe})\n\n{table(header, rows)}\n\n{conclusions}"


def selection_markdown(selection: Selection) -> str:
    if selection.chosen is None:
        head = f"No measured row completes under {selection.target_gb:g} GB."
    else:
        head = (
            f"Selected `{selection.chosen}`: {selection.peak_allocated_gb:.3f} GB allocated, "
            f"{selection.step_time_ms:.2f} ms/step (target {selection.target_gb:g} GB)."
        )
    return head + "\n\n" + table(("recompute", "why not chosen"), selection.considered)


def refresh_markdown(
    path: str,
    diff: Sequence[tuple[str, str, Any, Any, float | None]],
    previous: str | None,
    dry_run: bool = False,
) -> str:
    """The diff for a Megatron Core bump's pull request: per row and metric, old → new, Δ%. A dry run
    says so in its heading, so its step-summary section is never mistaken for the written golden."""
    base = (
        f"previous golden: `{previous}`"
        if previous
        else "no previous golden for this recipe and hardware"
    )
    rows = [
        (label, metric, format_value(metric, old), format_value(metric, new), _pct(delta))
        for label, metric, old, new, delta in diff
    ]
    heading = "Golden refresh (dry run: nothing written)" if dry_run else "Golden refresh"
    return f"### {heading}: `{path}`\n\n{base}\n\n" + table(
        ("row", "metric", "old", "new", "Δ%"), rows
    )


def matrix_markdown() -> str:
    """Every rule as one row of a markdown table (``matrix``)."""
    rows = []
    for rule in RULES:
        reads = ", ".join(f"`{field}`" for field in rule.reads)
        checked = (
            "yes"
            if rule.differential
            else "no (unit tests)"
            if rule.enforced_in == VALIDATOR
            else "no"
        )
        rows.append(
            (
                f"`{rule.id}`",
                reads,
                rule.condition,
                rule.outcome,
                rule.enforced_in,
                rule.source,
                checked,
            )
        )
    return table(
        ("id", "reads", "condition", "outcome", "enforced in", "source", "differential"), rows
    )
