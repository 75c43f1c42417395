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

from harness.config.label_facts import LABEL_FACTS
from harness.errors import UsageError
from harness.golden.format import (
    Golden,
    GoldenRow,
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
from harness.record.step_time import (
    Noise,
    StepTimeDecision,
    StepTimeRule,
    as_pct,
    by_round,
    decide,
    first_round,
    noise_from_equal_rows,
    noise_from_repeats,
    record_steady_time,
    round_effect,
    round_index,
)
from harness.record.vocabulary import RecordKind

# A row whose peak-allocated saving is within this many percent of zero freed nothing (moe_act on the
# H200 mcore image: -0.01 %, a 3 MB allocator difference).
INERT_SAVING_PCT = 0.1
# Judged together by ``StepTimeRule`` when the golden gives a noise to judge them against: a step time
# and the throughput it implies (TFLOP/s is the fixed FLOPs of the step over its time) are one
# measurement, tested once.
STEP_TIME_METRICS = (
    MetricName.STEP_TIME_MS,
    MetricName.STEP_TIME_COST_PCT,
    MetricName.TFLOPS_PER_GPU,
    MetricName.TFLOPS_CHANGE_PCT,
)


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
    rounds = by_round(records)
    numbers = {label: [round_index(job) for job in jobs] for label, jobs in rounds.items()}
    if any(len(set(found)) != len(found) for found in numbers.values()):
        raise UsageError(
            "two records share one recompute row and round; compare one record per row and round"
        )
    if len({tuple(found) for found in numbers.values()}) > 1:
        shown = "; ".join(f"{label} {found}" for label, found in numbers.items())
        raise UsageError(
            f"the rows were not measured in the same rounds ({shown}): each round pairs every row "
            "with that round's control; compare complete rounds"
        )
    records = first_round(records)
    by_label = {record.label: record for record in records}
    control = None
    if golden.judges_effects:
        control = matched_control(records)
        if control is None:
            raise UsageError(
                f"{golden_path} judges each row against its [] control, and these records have "
                "none: measure the [] control in the same sweep"
            )
    timing = step_time_checks(golden, rounds)
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
        if timing is not None:
            judged = [name for name in judged if name not in STEP_TIME_METRICS]
        for metric in judged:
            check = _judge(
                metric, row.values[metric], actual_values.get(metric), golden.tolerance[metric]
            )
            if inactive and metric == MetricName.SAVING_ALLOCATED_PCT and not check.passed:
                check = replace(check, verdict=inactive)
            comparison.checks.append(replace(check, label=row.label))
        if timing is not None and row.label in timing:
            comparison.checks.append(timing[row.label])
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


def _golden_series(row: GoldenRow) -> list[float] | None:
    """A golden row's step time per round: its rounds, or a golden of one job per row's one value."""
    if row.step_time is not None:
        return list(row.step_time["median_ms"])
    value = row.values.get(MetricName.STEP_TIME_MS)
    return None if value is None else [float(value)]


def _night_series(jobs: Sequence[Record], steady: bool) -> list[float] | None:
    """A night's step time per round, read as the golden read its own: each job's steady median
    (``steady``: a golden in rounds), else its headline (the steady window's mean)."""
    values: list[float] = []
    for job in jobs:
        if steady:
            found = record_steady_time(job)
            value: float | None = None if found is None else found.median_ms
        else:
            headline = job.headline[MetricName.STEP_TIME_MS]
            value = None if headline is None else float(headline)
        if value is None:
            return None
        values.append(value)
    return values


def golden_noise(golden: Golden, night_ms: dict[str, list[float]]) -> Noise | None:
    """The noise a golden's step times are judged against: each row's spread over the golden's
    rounds and tonight's, when either has several; else the golden's rows that must equal ``[]``
    (``does_nothing``), each an A/A pair; None when it has neither (its fixed rules judge then)."""
    control_row = next((row for row in golden.rows if row.recompute.is_control), None)
    control = None if control_row is None else _golden_series(control_row)
    if control_row is None or control is None:
        return None
    series = {row.label: found for row in golden.rows if (found := _golden_series(row)) is not None}
    tonight = len(night_ms.get(control_row.label, ()))
    if max(len(control), tonight) > 1:
        return noise_from_repeats(
            [series, night_ms], f"each row's repeats (golden {len(control)}, tonight {tonight})"
        )
    inert = {
        row.label: round_effect(series[row.label], control)
        for row in golden.rows
        if row.label in series and does_nothing(golden, row)
    }
    equal = noise_from_equal_rows(inert, list(series))
    return (
        None if equal is None else replace(equal, source=f"{equal.source} of the golden's 1 round")
    )


def does_nothing(golden: Golden, row: GoldenRow) -> bool:
    """A row that must time as ``[]``: its label is implemented only by a Transformer Engine class, the
    golden's measured stack has no TE (Megatron Core accepts the label and ignores it: ``moe_act`` with
    SequentialMLP experts on the mcore image), and the row indeed freed no memory."""
    facts = LABEL_FACTS.get(row.label)
    saving = row.values.get(MetricName.SAVING_ALLOCATED_PCT)
    return (
        golden.kind == RecordKind.RUN
        and not golden.pins.get("transformer_engine")
        and facts is not None
        and facts.te_class is not None
        and saving is not None
        and abs(saving) < INERT_SAVING_PCT
    )


def step_time_checks(
    golden: Golden, rounds: dict[str, list[Record]]
) -> dict[str, MetricCheck] | None:
    """Each row's step-time line (``harness.record.step_time.decide``), judged in rounds against the
    measured noise: the control by its absolute time, every other row by its effect against the
    control of its own round. None when there is no noise to judge against: the golden's fixed rules
    judge step time then."""
    control_row = next((row for row in golden.rows if row.recompute.is_control), None)
    if (
        golden.kind == RecordKind.CPU_PROBE
        or control_row is None
        or control_row.label not in rounds
    ):
        return None  # a CPU probe times nothing
    steady = control_row.step_time is not None
    golden_ms: dict[str, list[float]] = {}
    night_ms: dict[str, list[float]] = {}
    for row in golden.rows:
        before = _golden_series(row)
        if before is None or row.label not in rounds:
            continue
        now = _night_series(rounds[row.label], steady)
        if now is not None:
            golden_ms[row.label], night_ms[row.label] = before, now
    if control_row.label not in golden_ms:
        return None
    noise = golden_noise(golden, night_ms)
    if noise is None or control_row.label not in noise.rows:
        return None
    rule, decisions = decide(golden_ms, night_ms, control_row.label, noise)
    return {label: _check(label, rule, decision) for label, decision in decisions.items()}


def _check(label: str, rule: StepTimeRule, decision: StepTimeDecision) -> MetricCheck:
    metric = MetricName.STEP_TIME_MS if decision.absolute else MetricName.STEP_TIME_COST_PCT
    shown = rule.describe(decision.spread)
    if decision.night_standard_error is not None:
        shown = f"tonight ±{as_pct(decision.night_standard_error):.1f} pp s.e.; {shown}"
    verdict = (
        "pass"
        if decision.passed
        else _direction(metric, decision.golden, decision.night, effect=not decision.absolute)
    )
    return MetricCheck(
        label,
        metric,
        decision.golden,
        decision.night,
        as_pct(decision.change) if decision.absolute else None,
        shown,
        verdict,
        decision.night - decision.golden,
    )


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
    records = first_round(records)  # across revisions step time is judged at 0.9 pp, round 1's
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
