"""Golden checks as pytest JUnit properties: one property per judged metric, so CI shows the numbers."""

from __future__ import annotations

from collections.abc import Callable

from harness.golden.judge import Comparison
from harness.report.markdown import format_value


def record_golden_properties(
    comparison: Comparison, record_property: Callable[[str, object], None]
) -> None:
    """Call pytest's ``record_property`` for each check: ``golden.<row>.<metric>`` = verdict and values."""
    record_property("golden.file", comparison.golden_path)
    for check in comparison.checks:
        delta = "" if check.delta_pct is None else f" delta={check.delta_pct:+.3f}%"
        record_property(
            f"golden.{check.label}.{check.metric}",
            f"{check.verdict}: golden={format_value(check.metric, check.golden)} "
            f"actual={format_value(check.metric, check.actual)}{delta} tolerance={check.tolerance}",
        )
