"""Compare run records with a golden: refuse on differing pins or hardware, else judge every metric.

A recompute regression is a label that stopped saving, saves less, costs more, became inactive or now
fails: with a golden that holds effects (rows against the matched ``[]`` control), those are judged
first and named so; absolute values are judged on the control.

Tolerances are two-sided: a value far better than the golden fails too, because the golden no longer
describes the code and must be refreshed. A value the golden does not hold (null) is not judged; a
value the golden holds but the record lacks fails. NaN never gets here: records and goldens refuse it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.golden.format import (
    Golden,
    describe_pins,
    golden_values,
    identity_differences,
    pins_differences,
)
from harness.golden.store import near_misses
from harness.record.effects import matched_control
from harness.record.metrics import (
    EFFECT_METRICS,
    MATERIAL_COST_PCT,
    MATERIAL_SAVING_PCT,
    MetricName,
    declared_metric,
    higher_is_better,
)
from harness.record.metrics import metric as metric_named
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
    difference: float | None = None  # actual - golden, in the metric's unit (pp for percentages)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass
class Comparison:
    golden_path: str
    recipe: str
    checks: list[MetricCheck] = field(default_factory=list)
    # What was judged: None, every value at the golden's own pins; else why only the effects against the
    # [] control were (``compare_effects``), with both revision sets.
    effect_only: str | None = None

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[MetricCheck]:
        return [check for check in self.checks if not check.passed]


def refresh_command(golden_path: str, record_sources: Sequence[str] = ("RECORD...",)) -> str:
    return f"recompute-harness golden refresh --golden-dir {Path(golden_path).parent} {' '.join(record_sources)}"


def missing_golden_message(records: Sequence[Record], path: Path) -> str:
    """Why no golden judges ``records`` at ``path`` (the file their pins name), and how to write one."""
    nearest = near_misses(records, path)
    return (
        f"no golden {path.name} for these revision pins in {path.parent}{f' ({nearest})' if nearest else ''}; "
        f"write it from a real run: {refresh_command(str(path))}"
    )


def tolerance_text(rule: dict[str, Any], unit: str | None) -> str:
    if rule["mode"] == "exact":
        return "exact"
    if rule["mode"] == "absolute":
        return f"±{rule['abs']:g} {'pp' if unit == '%' else unit or ''}".rstrip()
    floor = rule.get("floor")
    shown = (
        "" if not floor else f" (≥ {floor / 1e9:g} GB)" if unit == "bytes" else f" (≥ {floor:g})"
    )
    return f"±{rule['rel'] * 100:g}%{shown}"


def within(golden: float, actual: float, rule: dict[str, Any]) -> bool:
    """The tolerance rule (``harness.record.metrics.Tolerance``), two-sided."""
    if rule["mode"] == "exact":
        return actual == golden
    if rule["mode"] == "absolute":
        return abs(actual - golden) <= rule["abs"]
    return abs(actual - golden) <= max(rule["rel"] * abs(golden), rule.get("floor") or 0)


def _direction(metric: str, golden: float, actual: float, effect: bool) -> str:
    """What a value outside its tolerance means, in the words a recompute regression is named by."""
    better = actual > golden if higher_is_better(metric) else actual < golden
    if not effect:
        return (
            "FAIL: improved beyond tolerance, refresh the golden" if better else "FAIL: regressed"
        )
    if metric.startswith("saving_"):
        return (
            "FAIL: saving grew beyond tolerance, refresh the golden"
            if better
            else "FAIL: saving shrank beyond tolerance"
        )
    if metric == MetricName.STEP_TIME_COST_PCT:
        return (
            "FAIL: cost shrank beyond tolerance, refresh the golden"
            if better
            else "FAIL: cost grew beyond tolerance"
        )
    return "FAIL: improved beyond tolerance, refresh the golden" if better else "FAIL: regressed"


def _judge(metric: str, golden: Any, actual: Any, rule: dict[str, Any]) -> MetricCheck:
    """One metric's check (the row label is filled in by the caller)."""
    found = metric_named(metric)
    unit = None if found is None else found.unit
    tolerance = tolerance_text(rule, unit)
    if golden is None:
        # Not in the golden: failed rows have no steady timing, and a transcribed source states only
        # some values. A changed outcome is judged by the row's outcome check instead.
        return MetricCheck("", metric, golden, actual, None, tolerance, "pass")
    if actual is None:
        return MetricCheck("", metric, golden, actual, None, tolerance, "FAIL: not measured")
    delta_pct = None if golden == 0 else (actual - golden) / abs(golden) * 100.0
    difference = actual - golden
    if within(golden, actual, rule):
        return MetricCheck("", metric, golden, actual, delta_pct, tolerance, "pass", difference)
    if rule["mode"] == "exact":
        return MetricCheck(
            "", metric, golden, actual, delta_pct, tolerance, "FAIL: changed", difference
        )
    verdict = _direction(metric, golden, actual, found is not None and found.scope == "effect")
    return MetricCheck("", metric, golden, actual, delta_pct, tolerance, verdict, difference)


def _stage_text(outcome: dict[str, Any]) -> str:
    parts = [outcome["status"]]
    if outcome.get("iteration") is not None:
        parts.append(f"iteration {outcome['iteration']}")
    if outcome.get("phase"):
        parts.append(outcome["phase"])
    return " ".join(parts)


def _outcome_verdict(golden: dict[str, Any], actual: dict[str, Any]) -> str:
    """Stages compared at the golden's precision: a golden that records only an OOM's iteration
    matches a run that also knows the phase; a golden that records the phase needs the same phase."""
    same = golden["status"] == actual["status"] and all(
        golden.get(key) is None or golden.get(key) == actual.get(key)
        for key in ("iteration", "phase")
    )
    if same:
        return "pass"
    if golden["status"] == "completed":
        return "FAIL: now fails where it passed"
    if actual["status"] == "completed":
        return "FAIL: now completes where it failed, refresh the golden"
    if "advanced-but-failed" in (golden["status"], actual["status"]):
        return "FAIL: advanced-but-failed changed stage"
    return "FAIL: failure stage changed"


def _inactive_verdict(golden: dict[str, Any], actual: dict[str, Any]) -> str | None:
    """A label that saved (or cost) at the golden and now does neither has stopped acting."""

    def material(values: dict[str, Any]) -> tuple[bool, bool]:
        saving, cost = (
            values.get(MetricName.SAVING_ALLOCATED_PCT),
            values.get(MetricName.STEP_TIME_COST_PCT),
        )
        return (
            saving is not None and saving >= MATERIAL_SAVING_PCT,
            cost is not None and abs(cost) >= MATERIAL_COST_PCT,
        )

    golden_saving, golden_cost = material(golden)
    actual_saving, actual_cost = material(actual)
    if golden_saving and not actual_saving:
        return "FAIL: became inactive" if golden_cost and not actual_cost else "FAIL: saving lost"
    return None


def compare_records(
    golden: Golden, records: Sequence[Record], golden_path: str, *, across_pins: bool = False
) -> Comparison:
    """Judge ``records`` against ``golden``. Raises ``UsageError`` (refusal) when pins or hardware differ.

    With a golden that holds effects, each row is judged first by its effect against the ``[]``
    control of its own set, and only the control by its absolute values (looser: a machine-wide
    shift shows as a shift of the control, not as every label regressing). ``across_pins`` skips
    the identity refusal: only for showing what a revision bump changed, never a verdict.
    """
    for record in records:
        differences = [] if across_pins else identity_differences(golden, record)
        if differences:
            raise UsageError(
                f"refusing to compare record {record.id} with {golden_path}: {'; '.join(differences)}; "
                f"a golden for these records is written by: {refresh_command(golden_path)}"
            )
    comparison = Comparison(golden_path=golden_path, recipe=golden.recipe)
    if golden.environment is None and any(r.workload.environment is not None for r in records):
        # An older or transcribed golden: its runs' environment is unknown, so it is not judged.
        comparison.checks.append(
            MetricCheck(
                "*",
                "environment",
                "not pinned",
                "recorded",
                None,
                "not judged: the golden predates environment records",
                "pass",
            )
        )
    by_label = {record.label: record for record in records}
    if len(by_label) != len(records):
        raise UsageError("two records share one recompute row; compare one record per row")
    control = None
    if golden.judges_effects:
        control = matched_control(records)
        if control is None:
            raise UsageError(
                f"{golden_path} judges each row against its [] control, and these records have "
                "none: measure the [] control in the same sweep"
            )
    for row in golden.rows:
        if row.label not in by_label:
            comparison.checks.append(
                MetricCheck(
                    row.label, "row", "present", "missing", None, "exact", "FAIL: row not measured"
                )
            )
            continue
        record = by_label.pop(row.label)
        actual_stage = record.outcome.stage()
        comparison.checks.append(
            MetricCheck(
                row.label,
                "outcome",
                _stage_text(row.outcome),
                _stage_text(actual_stage),
                None,
                "at the golden's precision",
                _outcome_verdict(row.outcome, actual_stage),
            )
        )
        actual_values = golden_values(record, golden.peak_scope, control)
        effect_row = golden.judges_effects and not row.recompute.is_control
        judged = [name for name in EFFECT_METRICS if name in row.values] if effect_row else []
        # Counts stay judged on every row; absolute values on the control (or every row of a golden
        # without effects).
        judged += [
            name
            for name in row.values
            if name not in EFFECT_METRICS
            and (not effect_row or declared_metric(name).scope == "count")
        ]
        inactive = _inactive_verdict(row.values, actual_values) if effect_row else None
        for metric in judged:
            check = _judge(
                metric, row.values[metric], actual_values.get(metric), golden.tolerance[metric]
            )
            if inactive and metric == MetricName.SAVING_ALLOCATED_PCT and not check.passed:
                check = replace(check, verdict=inactive)
            comparison.checks.append(replace(check, label=row.label))
    for label in by_label:
        comparison.checks.append(
            MetricCheck(
                label,
                "row",
                "absent",
                "present",
                None,
                "exact",
                "FAIL: row not in golden, refresh it",
            )
        )
    return comparison


# Across revisions a card study is judged by its effects only, each within half the smallest gap the
# card's own conclusions rest on (docs/runner.md, "The seed studies, every night"): Moonlight's savings
# split into "none" (core_attn 0.01 %) and "about 1.9 %" (1.83-1.96 %), a 1.82 pp gap; its costs rank
# moe_act (1.99 %) below core_attn (3.85 %), a 1.86 pp gap. Within 0.9 pp every such conclusion holds.
EFFECT_ONLY_TOLERANCE: dict[str, dict[str, Any]] = {
    MetricName.SAVING_ALLOCATED_PCT: {"mode": "absolute", "abs": 0.9},
    MetricName.STEP_TIME_COST_PCT: {"mode": "absolute", "abs": 0.9},
}


def compare_effects(golden: Golden, records: Sequence[Record], golden_path: str) -> Comparison:
    """Judge ``records`` of other revisions than ``golden``'s by their effects alone: each row's saving
    and step-time cost against the ``[]`` control of its own set, and its pass/OOM stage, against the
    golden's (``EFFECT_ONLY_TOLERANCE``). Absolute values are never judged across revisions. Recipe and
    hardware must still be the golden's (``UsageError`` otherwise)."""
    for record in records:
        if record.workload.recipe != golden.recipe or record.hardware.profile() != golden.hardware:
            raise UsageError(
                f"refusing to compare record {record.id} with {golden_path}: recipe or hardware differ "
                f"({record.workload.recipe} on {record.hardware.profile()}, golden {golden.recipe} on "
                f"{golden.hardware})"
            )
    control = matched_control(records)
    if control is None:
        raise UsageError(
            f"{golden_path}: an effect-only comparison needs the [] control measured in the same sweep"
        )
    pins = control.pins()
    comparison = Comparison(
        golden_path=golden_path,
        recipe=golden.recipe,
        effect_only=(
            f"effect-only: these records' revisions ({describe_pins(pins)}) are not the golden's "
            f"({describe_pins(golden.pins)}; differs in {', '.join(pins_differences(golden, pins))}): "
            "each row's saving, cost and stage against its own [] control are judged, no absolute value"
        ),
    )
    by_label: dict[str, Record | None] = {record.label: record for record in records}
    for row in golden.rows:
        measured = by_label.pop(row.label, None)
        if measured is None:
            comparison.checks.append(
                MetricCheck(
                    row.label, "row", "present", "missing", None, "exact", "FAIL: row not measured"
                )
            )
            continue
        stage = measured.outcome.stage()
        comparison.checks.append(
            MetricCheck(
                row.label,
                "outcome",
                _stage_text(row.outcome),
                _stage_text(stage),
                None,
                "at the golden's precision",
                _outcome_verdict(row.outcome, stage),
            )
        )
        if row.recompute.is_control:
            continue
        actual = golden_values(measured, golden.peak_scope, control)
        inactive = _inactive_verdict(row.values, actual)
        for metric, rule in EFFECT_ONLY_TOLERANCE.items():
            if metric not in row.values:
                continue
            check = _judge(metric, row.values[metric], actual.get(metric), rule)
            if inactive and metric == MetricName.SAVING_ALLOCATED_PCT and not check.passed:
                check = replace(check, verdict=inactive)
            comparison.checks.append(replace(check, label=row.label))
    for label in by_label:
        comparison.checks.append(
            MetricCheck(label, "row", "absent", "present", None, "exact", "FAIL: row not in golden")
        )
    return comparison
