"""Compare run records with a golden: refuse on differing pins or hardware, else judge every metric.

Tolerances are two-sided: a value far better than the golden fails too, because the golden no longer
describes the code and must be refreshed. A value the golden does not hold (null) is not judged; a
value the golden holds but the record lacks fails. NaN never gets here: records and goldens refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from harness.errors import UsageError
from harness.record.golden import Golden, golden_values
from harness.record.metrics import higher_is_better
from harness.record.model import Record


@dataclass(frozen=True)
class MetricCheck:
    """One line of the comparison table."""

    label: str
    metric: str
    golden: Any
    actual: Any
    delta_pct: float | None
    tolerance: str
    verdict: str  # "pass", or "FAIL: <why>"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass
class Comparison:
    golden_path: str
    recipe: str
    checks: list[MetricCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[MetricCheck]:
        return [check for check in self.checks if not check.passed]


def refresh_command(golden_path: str, record_sources: Sequence[str] = ("RECORD...",)) -> str:
    return f"recompute-harness golden refresh --golden-dir {Path(golden_path).parent} {' '.join(record_sources)}"


def identity_differences(golden: Golden, record: Record) -> list[str]:
    """Every pin, hardware or recipe field where ``record`` differs from ``golden``.

    A pin the golden leaves null was not recorded by its source (e.g. the skill card gives commits, no
    fingerprint); it is not compared. Every pin the golden states must match exactly.
    """
    differences = []
    # A GPU run may be judged against a transcribed reference golden of its exact pins; a CPU probe only
    # against CPU-probe goldens.
    if (record.kind == "cpu-probe") != (golden.kind == "cpu-probe"):
        differences.append(f"kind {golden.kind} != {record.kind}")
    if record.workload.recipe != golden.recipe:
        differences.append(f"recipe {golden.recipe} != {record.workload.recipe}")
    for key, value in record.hardware.profile().items():
        if value != golden.hardware[key]:
            differences.append(f"hardware.{key} {golden.hardware[key]} != {value}")
    pins = record.pins()
    for key, pinned in golden.pins.items():
        actual = pins[key]
        if isinstance(pinned, dict):
            for sub, pinned_value in pinned.items():
                actual_value = None if not isinstance(actual, dict) else actual.get(sub)
                if pinned_value is not None and actual_value != pinned_value:
                    differences.append(f"{key}.{sub} {pinned_value} != {actual_value}")
        elif pinned is not None and actual != pinned:
            differences.append(f"{key} {pinned} != {actual}")
    return differences


def _judge(metric: str, golden: Any, actual: Any, rule: dict[str, Any]) -> tuple[float | None, str, str]:
    """(Δ%, tolerance text, verdict) for one metric."""
    tolerance = "exact" if rule["mode"] == "exact" else f"±{rule['rel'] * 100:g}%"
    if golden is None:
        # Not in the golden: failed rows have no steady timing, and a transcribed source states only
        # some values. A changed outcome is judged by the row's outcome check instead.
        return None, tolerance, "pass"
    if actual is None:
        return None, tolerance, "FAIL: not measured"
    delta_pct = None if golden == 0 else (actual - golden) / abs(golden) * 100.0
    if rule["mode"] == "exact":
        return delta_pct, tolerance, "pass" if actual == golden else "FAIL: changed"
    within = actual == golden if golden == 0 else abs(actual - golden) <= rule["rel"] * abs(golden)
    if within:
        return delta_pct, tolerance, "pass"
    better = actual > golden if higher_is_better(metric) else actual < golden
    return delta_pct, tolerance, "FAIL: improved beyond tolerance, refresh the golden" if better else "FAIL: regressed"


def _stage(outcome: dict[str, Any]) -> str:
    parts = [outcome["status"]]
    if outcome.get("iteration") is not None:
        parts.append(f"iteration {outcome['iteration']}")
    if outcome.get("phase"):
        parts.append(outcome["phase"])
    return " ".join(parts)


def compare_records(golden: Golden, records: Sequence[Record], golden_path: str, *,
                    across_pins: bool = False) -> Comparison:
    """Judge ``records`` against ``golden``. Raises ``UsageError`` (refusal) when pins or hardware differ.

    ``across_pins`` skips that refusal: only for showing what a revision bump changed, never a verdict.
    """
    for record in records:
        differences = [] if across_pins else identity_differences(golden, record)
        if differences:
            raise UsageError(
                f"refusing to compare record {record.id} with {golden_path}: {'; '.join(differences)}; "
                f"a golden for these records is written by: {refresh_command(golden_path)}"
            )
    comparison = Comparison(golden_path=golden_path, recipe=golden.recipe)
    by_label = {record.label: record for record in records}
    if len(by_label) != len(records):
        raise UsageError("two records share one recompute row; compare one record per row")
    for row in golden.rows:
        record = by_label.pop(row.label, None)
        if record is None:
            comparison.checks.append(MetricCheck(row.label, "row", "present", "missing", None, "exact", "FAIL: row not measured"))
            continue
        golden_stage, actual_stage = _stage(row.outcome), _stage(record.outcome.stage())
        comparison.checks.append(MetricCheck(
            row.label, "outcome", golden_stage, actual_stage, None, "exact",
            "pass" if golden_stage == actual_stage else "FAIL: outcome changed",
        ))
        actual_values = golden_values(record)
        for metric, golden_value in row.values.items():
            rule = golden.tolerance[metric]
            actual = actual_values.get(metric)
            delta, tolerance, verdict = _judge(metric, golden_value, actual, rule)
            comparison.checks.append(MetricCheck(row.label, metric, golden_value, actual, delta, tolerance, verdict))
    for label in by_label:
        comparison.checks.append(MetricCheck(label, "row", "absent", "present", None, "exact", "FAIL: row not in golden, refresh it"))
    return comparison
