"""The skill's matched table: each recompute row against the ``[]`` control of the same configuration.

Only conclusions the data allows: records must differ in the recompute fields alone (else refused),
a ranking needs a matched ``[]`` control (else refused), savings are judged on allocated memory at the
same checkpoint (reserved memory alone is allocator caching), and a run that fails is never a pass —
if it got further than the control it is ``advanced-but-failed``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Any, cast

from harness.errors import UsageError
from harness.record.effects import completed, effects, is_control
from harness.record.metrics import MATERIAL_SAVING_PCT, MetricName
from harness.record.model import Outcome, Record
from harness.record.schema import PHASES

GB = 1e9


@dataclass
class Row:
    """One line of the matched table."""

    label: str
    record: str
    status: str
    stage: str
    peak_allocated_gb: float | None
    peak_after_iteration: int | None
    peak_reserved_gb: float | None
    step_time_ms: float | None
    tflops_per_gpu: float | None
    allocated_vs_control_pct: float | None
    reserved_vs_control_pct: float | None
    time_vs_control_pct: float | None
    verdict: str  # control | pass | failed | advanced-but-failed
    rank: int | None = None  # 1 = first choice among passing rows with a material saving
    note: str = ""


@dataclass
class Analysis:
    recipe: str
    model: str
    control: str | None
    rows: list[Row] = field(default_factory=list)
    conclusions: list[str] = field(default_factory=list)
    hardware: str = ""  # e.g. "8x H100_80GB"
    revisions: str = ""  # e.g. "mcore 24bad8e677d2, bridge 600d069b824d"

    def as_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "model": self.model,
            "control": self.control,
            "hardware": self.hardware,
            "revisions": self.revisions,
            "rows": [asdict(row) for row in self.rows],
            "conclusions": self.conclusions,
        }


def _configuration(record: Record) -> dict[str, Any]:
    """Everything that must be equal for two records to be a matched comparison."""
    workload = record.workload.to_json()
    config: dict[str, Any] = {"kind": record.kind}
    config.update(
        {key: value for key, value in workload.items() if key not in ("parallelism", "extra")}
    )
    config.update({f"parallelism.{key}": value for key, value in workload["parallelism"].items()})
    config.update({f"hardware.{key}": value for key, value in record.hardware.profile().items()})
    config.update({f"revisions.{key}": repr(value) for key, value in record.pins().items()})
    return config


def require_matched(records: Sequence[Record]) -> None:
    """Refuse records that differ in anything but the recompute fields, naming what differs."""
    if not records:
        raise UsageError("no records to analyse")
    probes = [r.id for r in records if r.kind == "cpu-probe"]
    if probes:
        raise UsageError(
            f"{probes[0]}: CPU-probe records are checked against CPU goldens, not analysed as runs"
        )
    configs = [_configuration(record) for record in records]
    differing = []
    for key in configs[0]:
        values = sorted({repr(config[key]) for config in configs})
        if len(values) > 1:
            differing.append(f"{key} ({', '.join(values[:3])}{', ...' if len(values) > 3 else ''})")
    if differing:
        raise UsageError(
            "records are not a matched set (they must differ in the recompute fields alone); "
            f"they differ in {'; '.join(differing)}"
        )


def _progress(record: Record) -> tuple[int, int] | None:
    """How far a run got: (iteration, phase order); None when the record does not say."""
    outcome = record.outcome
    if outcome.iteration is None:
        return None
    return outcome.iteration, -1 if outcome.phase is None else PHASES.index(outcome.phase)


def _pct(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base * 100.0


def _stage(outcome: Outcome) -> str:
    parts = [outcome.status]
    if outcome.iteration is not None:
        parts.append(f"iteration {outcome.iteration}")
    parts += [part for part in (outcome.phase, outcome.site) if part]
    if outcome.ranks:
        parts.append("rank " + ",".join(map(str, outcome.ranks)))
    return " ".join(parts)


def _row(record: Record, control: Record | None) -> Row:
    headline = record.headline
    peak, reserved = (
        headline[MetricName.PEAK_ALLOCATED_BYTES],
        headline[MetricName.PEAK_RESERVED_BYTES],
    )
    # The schema checks a metric in "iterations" is an integer (record/model.py: HEADLINE_JSON, on load).
    after = cast(int | None, headline[MetricName.PEAK_AFTER_ITERATION])
    allocated_pct = reserved_pct = time_pct = None
    note = ""
    if control is not None and record is not control:
        base = control.headline
        # Peaks are comparable only at the same checkpoint, over the same ranks.
        same_checkpoint = (headline[MetricName.PEAK_AFTER_ITERATION], headline.peak_scope) == (
            base[MetricName.PEAK_AFTER_ITERATION],
            base.peak_scope,
        )
        effect = effects(record, control, peaks=same_checkpoint)
        if same_checkpoint:
            saving = effect.get(MetricName.SAVING_ALLOCATED_PCT)
            allocated_pct = None if saving is None else -saving
            reserved_pct = effect.get(MetricName.RESERVED_CHANGE_PCT)
        elif peak is not None and base[MetricName.PEAK_ALLOCATED_BYTES] is not None:

            def when(h: Any) -> str:
                it = h[MetricName.PEAK_AFTER_ITERATION]
                return f"after iteration {it}" if it is not None else "at an unstated checkpoint"

            note = f"peak read {when(headline)}, the control's {when(base)}: not comparable"
        time_pct = effect.get(MetricName.STEP_TIME_COST_PCT)
    return Row(
        label=record.label,
        record=record.id,
        status=record.outcome.status,
        stage=_stage(record.outcome),
        peak_allocated_gb=None if peak is None else peak / GB,
        peak_after_iteration=after,
        peak_reserved_gb=None if reserved is None else reserved / GB,
        step_time_ms=headline[MetricName.STEP_TIME_MS],
        tflops_per_gpu=headline[MetricName.TFLOPS_PER_GPU],
        allocated_vs_control_pct=allocated_pct,
        reserved_vs_control_pct=reserved_pct,
        time_vs_control_pct=time_pct,
        verdict="control" if record is control else "pass" if completed(record) else "failed",
        note=note,
    )


def _failed_verdict(row: Row, record: Record, control: Record | None) -> None:
    """Failed rows: did the boundary get further than the control (progress or matched peak)?"""
    if control is None or completed(control):
        row.note = row.note or "failed where the control completed"
        return
    mine, theirs = _progress(record), _progress(control)
    saving = row.allocated_vs_control_pct
    if record.outcome.status == "advanced-but-failed" or (mine and theirs and mine > theirs):
        row.verdict, row.note = (
            "advanced-but-failed",
            "got further than the control but still failed; not a pass",
        )
    elif (
        saving is not None
        and saving <= -MATERIAL_SAVING_PCT  # relief: a material saving at the same checkpoint
        and mine is not None
        and theirs is not None
        and mine >= theirs
    ):
        row.verdict = "advanced-but-failed"
        row.note = (
            f"{-saving:.2f}% less allocated than the control at iteration "
            f"{row.peak_after_iteration}, but still failed; not a pass"
        )
    elif mine is not None and theirs is not None and mine < theirs:
        row.note = "failed earlier than the control"


def _rank_passing(rows: list[Row], records: dict[str, Record], control_completed: bool) -> None:
    """Rank passing rows with a material saving that no other row beats on both memory and time."""
    passing = [row for row in rows if row.verdict == "pass"]
    if control_completed:
        candidates = []
        for row in passing:
            if (
                row.allocated_vs_control_pct is None
                or row.allocated_vs_control_pct > -MATERIAL_SAVING_PCT
            ):
                change = (
                    "n/a"
                    if row.allocated_vs_control_pct is None
                    else f"{row.allocated_vs_control_pct:+.2f}%"
                )
                reserved = row.reserved_vs_control_pct
                caching = (
                    f"; reserved {reserved:+.2f}% is allocator caching, not a saving"
                    if reserved is not None and reserved <= -MATERIAL_SAVING_PCT
                    else ""
                )
                row.note = f"no material allocated saving ({change} vs [])" + caching
            else:
                candidates.append(row)
    else:
        candidates = passing  # the control did not complete: any passing row is relief
    # Pareto front on (step time, allocated peak), walked from the cheapest row.
    ordered = sorted(
        candidates,
        key=lambda r: (
            r.step_time_ms,
            r.peak_allocated_gb or 0.0,
            records[r.record].recompute.width,
        ),
    )
    ranked: list[Row] = []
    for row in ordered:
        dominating = next(
            (
                r
                for r in ranked
                if row.peak_allocated_gb is not None
                and r.peak_allocated_gb is not None
                and r.peak_allocated_gb <= row.peak_allocated_gb
            ),
            None,
        )
        if dominating is not None:
            row.note = f"dominated by {dominating.label}: no lower allocated peak, more step time"
            continue
        ranked.append(row)
        row.rank = len(ranked)


def analyse(records: Sequence[Record]) -> Analysis:
    """The matched table and its conclusions; refuses unmatched sets and sets without a ``[]`` control."""
    require_matched(records)
    controls = [record for record in records if is_control(record)]
    first = records[0]
    if not controls:
        raise UsageError(
            f"cannot rank recompute rows of {first.workload.recipe}: no matched [] control "
            "(a selective row with recompute_modules=[] measured in the same configuration)"
        )
    control = controls[0]
    by_id = {record.id: record for record in records}
    rows = [_row(record, control) for record in records]
    for row in rows:
        if row.verdict == "failed":
            _failed_verdict(row, by_id[row.record], control)
    control_row = next(row for row in rows if row.verdict == "control")
    if not completed(control):
        control_row.note = (
            f"control did not complete ({control_row.stage}): no steady-state timing to compare"
        )
    _rank_passing(rows, by_id, completed(control))
    rows.sort(key=lambda r: (r.verdict != "control", r.rank is None, r.rank or 0, r.label))
    analysis = Analysis(
        recipe=first.workload.recipe,
        model=first.workload.model,
        control=control_row.label,
        rows=rows,
        hardware=f"{first.hardware.gpu_count}x {first.hardware.device}",
        revisions=_revisions(first),
    )
    analysis.conclusions = _conclusions(rows)
    return analysis


def _revisions(record: Record) -> str:
    mcore, bridge = record.revisions.megatron_core, record.revisions.megatron_bridge
    parts = [f"mcore {(mcore.commit or '')[:12] or mcore.version or '?'}"]
    if bridge is not None:
        parts.append(f"bridge {(bridge.commit or '')[:12] or bridge.version or '?'}")
    if record.revisions.torch:
        parts.append(f"torch {record.revisions.torch}")
    return ", ".join(parts)


def ranked_rows(rows: Iterable[Row]) -> list[tuple[int, Row]]:
    """The ranked rows with their rank, first choice first."""
    return sorted(((row.rank, row) for row in rows if row.rank is not None), key=itemgetter(0))


def _conclusions(rows: list[Row]) -> list[str]:
    ranked = ranked_rows(rows)
    lines = []
    for rank, row in ranked:
        cost = (
            ""
            if row.time_vs_control_pct is None
            else f", {row.time_vs_control_pct:+.2f}% step time vs []"
        )
        saving = (
            ""
            if row.allocated_vs_control_pct is None
            else f"{row.allocated_vs_control_pct:+.2f}% allocated vs []"
        )
        where = "first choice" if rank == 1 else f"choice {rank}"
        _, first = ranked[0]  # here, in the loop, there is a first choice
        if rank > 1 and first.peak_allocated_gb is not None and row.peak_allocated_gb is not None:
            extra = (
                f" ({(row.peak_allocated_gb - first.peak_allocated_gb) * 1000:+.0f} MB = "
                f"{_pct(row.peak_allocated_gb, first.peak_allocated_gb):+.2f}% allocated, "
                f"{_pct(row.step_time_ms, first.step_time_ms):+.2f}% step time vs {first.label})"
            )
        else:
            extra = ""
        lines.append(
            f"{where}: {row.label} ({saving or 'completes where [] did not'}{cost}){extra}"
        )
    for row in rows:
        if row.verdict == "advanced-but-failed":
            lines.append(f"advanced but failed, not a pass: {row.label} ({row.stage})")
    if not ranked:
        lines.append("no row both completed and gave a material allocated saving")
    return lines
