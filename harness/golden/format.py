"""Golden files: one per recipe × hardware × revision pin (where they live: ``harness.golden.store``).

A golden holds, per recompute row, the headline values of a record set, the tolerance policy each
metric is judged by, the revision pins the values are valid for, and where the numbers came from. It
is built only from validated records (``golden_from_records``) and written atomically; NaN or inf can
never enter one (the strict loader and writer refuse them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, NoReturn, TypedDict

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.record.effects import SCOPES, effects, matched_control, scoped_peaks
from harness.record.metrics import (
    EFFECT_METRICS,
    METRICS,
    OPTIONAL_TOLERANCE_KEYS,
    RUN_GOLDEN_METRICS,
    TOLERANCE_KEYS,
    default_tolerance_policy,
    metrics_in,
)
from harness.record.model import PIN_KEYS, Hardware, Outcome, ProbeMetrics, Record, Revisions
from harness.record.step_time import by_round, first_round, in_rounds, record_steady_time
from harness.record.vocabulary import RecordKind
from harness.typed_json import NON_NEGATIVE, ObjectShape, check_json, part_of, rules

GOLDEN_SCHEMA = "recompute-harness/golden"
GOLDEN_SCHEMA_VERSION = 1
# A golden written before peak scopes were part of its identity holds what runs report: the hottest rank.
DEFAULT_PEAK_SCOPE = "all-ranks"


# How a measured run actually ran, beyond its recipe: the attention back end and MoE token dispatcher
# the ranks reported (HybridEP's buffers live outside the torch allocator, alltoall's inside: a
# fallback shifts every peak, so it is another workload, not a regression).
class WorkloadIdentity(TypedDict):
    attention_backend: str | None
    moe_dispatcher: str | None


WORKLOAD_IDENTITY_KEYS = tuple(WorkloadIdentity.__annotations__)


# A row's step time measured in rounds (``run --rounds``; harness.record.step_time): per round, the
# median of the steady iterations, the iterations warm-up took and the steady iterations counted.
# A step-time tolerance is derived from these repeats when judging (harness.golden.judge).
class StepTimeRounds(TypedDict):
    median_ms: list[Annotated[float, NON_NEGATIVE]]
    warmup: list[Annotated[int, NON_NEGATIVE]]
    steady: list[Annotated[int, NON_NEGATIVE]]


@dataclass
class GoldenRow:
    label: str
    recompute: RecomputeFields
    # What a golden keeps of a record's outcome (Outcome.stage).
    outcome: dict[str, Any] = field(
        metadata=rules(shape=part_of(Outcome, ("status", "iteration", "phase")))
    )
    values: dict[str, int | float | None]  # the registry says which, and their ranges
    record: str | None = None  # id of the record the values came from (the first round's)
    # None (no key): the golden was written from one job per row, its step time is ``values``' alone.
    step_time: StepTimeRounds | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "label": self.label,
            "recompute": self.recompute.as_dict(),
            "outcome": dict(self.outcome),
            "values": dict(self.values),
        }
        if self.record is not None:
            data["record"] = self.record
        if self.step_time is not None:
            data["step_time"] = {
                "median_ms": list(self.step_time["median_ms"]),
                "warmup": list(self.step_time["warmup"]),
                "steady": list(self.step_time["steady"]),
            }
        return data


@dataclass
class Golden:
    kind: str = field(metadata=rules(one_of=RecordKind))
    recipe: str
    # A record's hardware profile and pins (Hardware.profile, Revisions.pins).
    hardware: dict[str, Any] = field(
        metadata=rules(shape=part_of(Hardware, ("device", "gpu_count")))
    )
    pins: dict[str, Any] = field(metadata=rules(shape=part_of(Revisions, PIN_KEYS)))
    provenance: dict[str, Any]  # open, but with a source (validate_golden)
    tolerance: dict[str, dict[str, Any]]  # a rule's keys depend on its mode (validate_golden)
    rows: list[GoldenRow] = field(default_factory=list, metadata=rules(required=True))
    # Whose peaks the values are (``harness.record.effects.SCOPES``); None (no key: never null):
    # written before scopes were stated, i.e. the hottest rank's.
    peak_scope: str | None = field(default=None, metadata=rules(one_of=SCOPES, shape=str))
    # As-run workload facts; None in goldens written before them and transcribed ones.
    workload: dict[str, str | None] | None = field(
        default=None, metadata=rules(shape=WorkloadIdentity | None)
    )
    # CPU probes: the accepted labels the model does not exercise, with why (harness.probe.present.coverage).
    unmeasured: list[dict[str, Any]] | None = None
    # The variables that change allocator, dispatcher, kernels or graphs, as the golden's runs had them
    # (a record's ``workload.environment``): pinned like the revisions. None (no key) in goldens written
    # before environments were recorded and in transcribed ones: their runs' environment is unknown,
    # so it is not judged (``compare_records`` says so in a line of its own).
    environment: dict[str, str] | None = field(
        default=None, metadata=rules(shape=dict[str, str] | None)
    )

    @classmethod
    def from_json(cls, data: Any, source: str) -> Golden:
        validate_golden(data, source)
        rows = [
            GoldenRow(
                row["label"],
                RecomputeFields.from_dict(row["recompute"]),
                dict(row["outcome"]),
                dict(row["values"]),
                row.get("record"),
                None if row.get("step_time") is None else _step_time_rounds(row["step_time"]),
            )
            for row in data["rows"]
        ]
        unmeasured = data.get("unmeasured")
        return cls(
            data["kind"],
            data["recipe"],
            dict(data["hardware"]),
            data["pins"],
            dict(data["provenance"]),
            {name: dict(rule) for name, rule in data["tolerance"].items()},
            rows,
            data.get("peak_scope"),
            None if data.get("workload") is None else dict(data["workload"]),
            None if unmeasured is None else [dict(entry) for entry in unmeasured],
            None if data.get("environment") is None else dict(data["environment"]),
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "schema": GOLDEN_SCHEMA,
            "schema_version": GOLDEN_SCHEMA_VERSION,
            "kind": self.kind,
            "recipe": self.recipe,
            "hardware": dict(self.hardware),
            "pins": self.pins,
            **({} if self.workload is None else {"workload": dict(self.workload)}),
            **({} if self.environment is None else {"environment": dict(self.environment)}),
        }
        if self.peak_scope is not None:
            data["peak_scope"] = self.peak_scope
        data.update(
            {
                "provenance": dict(self.provenance),
                "tolerance": self.tolerance,
                "rows": [row.to_json() for row in self.rows],
            }
        )
        if self.unmeasured is not None:
            data["unmeasured"] = [dict(entry) for entry in self.unmeasured]
        return data

    @property
    def scope(self) -> str:
        return self.peak_scope or DEFAULT_PEAK_SCOPE

    @property
    def judges_effects(self) -> bool:
        """Rows are judged by their effect against the control (the control by its absolute values)."""
        return any(name in row.values for row in self.rows for name in EFFECT_METRICS)

    @property
    def date(self) -> str:
        return str(self.provenance.get("date") or "")


def _step_time_rounds(data: dict[str, Any]) -> StepTimeRounds:
    return StepTimeRounds(
        median_ms=list(data["median_ms"]), warmup=list(data["warmup"]), steady=list(data["steady"])
    )


def step_time_rounds(rounds: Sequence[Record]) -> StepTimeRounds | None:
    """One row's jobs, a record per round in round order, as a golden keeps them; None when a job
    timed too few iterations for a steady time."""
    steady = [record_steady_time(record) for record in rounds]
    if any(found is None for found in steady):
        return None
    kept = [found for found in steady if found is not None]
    return StepTimeRounds(
        median_ms=[found.median_ms for found in kept],
        warmup=[found.warmup for found in kept],
        steady=[found.steady for found in kept],
    )


def golden_values(
    record: Record, scope: str | None = None, control: Record | None = None
) -> dict[str, int | float | None]:
    """The golden-comparable values of one record (registry: ``Metric.golden``): its peaks in
    ``scope``, and, with the set's ``control``, its effects against it."""
    if isinstance(record.metrics, ProbeMetrics):  # the metrics of every cpu-probe record
        return dict(record.metrics.values)
    values = record.run_metrics.golden_values(RUN_GOLDEN_METRICS)
    if scope is not None:
        values.update(scoped_peaks(record, scope))
    return {**(effects(record, control, scope) if control is not None else {}), **values}


def workload_identity(record: Record) -> dict[str, str | None] | None:
    """The record's as-run workload facts; None for kinds that carry none (CPU probes, transcriptions)."""
    if record.kind != "run":
        return None
    return {
        "attention_backend": record.workload.attention_backend,
        "moe_dispatcher": record.workload.extra.get("moe_dispatcher"),
    }


def pin_differences(key: str, pinned: Any, actual: Any) -> list[str]:
    """Where ``actual`` differs from one pin a golden states (null parts are not compared).

    A package pin (``{version, commit, fingerprint}``) that states a commit and a version + fingerprint
    matches by either: the commit, or the version with the fingerprint of the recompute sources. That is
    how one golden serves a wheel (no commit) and Bridge's git submodule (commit) of the same sources.
    """
    if not isinstance(pinned, dict):
        return [] if pinned is None or actual == pinned else [f"{key} {pinned} != {actual}"]
    actual = actual if isinstance(actual, dict) else {}
    differing = [
        sub for sub, value in pinned.items() if value is not None and actual.get(sub) != value
    ]
    if pinned.get("commit") is not None and pinned.get("fingerprint") is not None:
        if "commit" not in differing:  # matched by commit: version and fingerprint are not asked
            differing = [sub for sub in differing if sub not in ("version", "fingerprint")]
        elif not {"version", "fingerprint"} & set(differing):  # matched by the same sources
            differing = [sub for sub in differing if sub != "commit"]
    return [f"{key}.{sub} {pinned[sub]} != {actual.get(sub)}" for sub in differing]


def identity_differences(golden: Golden, record: Record) -> list[str]:
    """Every pin, hardware or recipe field where ``record`` differs from ``golden``.

    A pin the golden leaves null was not recorded by its source (e.g. the skill card gives commits, no
    fingerprint); it is not compared. Every pin the golden states must match exactly, except that a
    package pinned by commit and by version + fingerprint matches by either (``pin_differences``).
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
    as_run = workload_identity(record) or {}
    for key, value in (golden.workload or {}).items():
        if as_run.get(key) != value:
            differences.append(f"workload.{key} {value} != {as_run.get(key)}")
    return (
        differences
        + environment_pin_differences(golden, record)
        + pins_differences(golden, record.pins())
    )


def environment_pin_differences(golden: Golden, record: Record) -> list[str]:
    """Where ``record`` ran with another environment than the one ``golden`` is pinned to (nothing when
    the golden pins none); a record that kept none cannot be shown to match one."""
    if golden.environment is None:
        return []
    actual = record.workload.environment
    if actual is None:
        return [
            "environment: the golden pins one, the record kept none (written before environments)"
        ]
    return [
        f"environment.{name} {golden.environment.get(name, '<unset>')} != {actual.get(name, '<unset>')}"
        for name in sorted(set(golden.environment) | set(actual))
        if golden.environment.get(name) != actual.get(name)
    ]


def describe_pins(pins: dict[str, Any]) -> str:
    """Revision pins in words: ``megatron_core 0.19.2 a07a0245..., megatron_bridge 0.6.2, torch 2.14.1``
    (each package's stated version, commit (12 characters) and fingerprint; unstated pins left out)."""
    parts = []
    for key in PIN_KEYS:
        pinned = pins.get(key)
        if isinstance(pinned, dict):
            stated = [
                str(pinned[sub])[:12] if sub == "commit" else str(pinned[sub])
                for sub in ("version", "commit", "fingerprint")
                if pinned.get(sub)
            ]
            if stated:
                parts.append(f"{key} {' '.join(stated)}")
        elif pinned is not None:
            parts.append(f"{key} {pinned}")
    return ", ".join(parts) or "no pins"


def pins_differences(golden: Golden, pins: dict[str, Any]) -> list[str]:
    """Where ``pins`` (a record's, or an installed stack's) differ from every pin ``golden`` states."""
    return [
        difference
        for key, pinned in golden.pins.items()
        for difference in pin_differences(key, pinned, pins.get(key))
    ]


def golden_from_records(
    records: Sequence[Record],
    provenance: dict[str, Any],
    tolerance: dict[str, dict[str, Any]] | None = None,
) -> Golden:
    """Build a golden from one recipe × hardware × pin set of validated records."""
    if not records:
        raise UsageError("no records to build a golden from")
    first = records[0]
    identity = (
        first.kind,
        first.workload.recipe,
        first.hardware.profile(),
        first.pins(),
        workload_identity(first),
        first.workload.environment,
    )
    for record in records[1:]:  # every round's
        other = (
            record.kind,
            record.workload.recipe,
            record.hardware.profile(),
            record.pins(),
            workload_identity(record),
            record.workload.environment,
        )
        if other != identity:
            raise UsageError(
                f"record {record.id}: kind, recipe, hardware, pins, environment or as-run workload "
                f"(attention back end, MoE dispatcher) differ from record {first.id}; a golden covers one "
                "recipe × hardware × revision pin × environment × workload"
            )
    rounds = by_round(records) if any(in_rounds(record) for record in records) else None
    every_record, records = records, first_round(records)
    if rounds is not None and len({len(jobs) for jobs in rounds.values()}) > 1:
        counts = ", ".join(f"{label} {len(jobs)}" for label, jobs in rounds.items())
        raise UsageError(
            f"rows measured in different numbers of rounds ({counts}); rerun the sweep"
        )
    scope = None
    control = None
    if first.kind != "cpu-probe":
        control = matched_control(records)
        scope = (
            first.headline.peak_scope if first.headline.peak_scope in SCOPES else DEFAULT_PEAK_SCOPE
        )
    rows = [
        GoldenRow(
            record.label,
            record.recompute,
            record.outcome.stage(),
            golden_values(record, scope, control),
            record.id,
            None if rounds is None else step_time_rounds(rounds[record.label]),
        )
        for record in records
    ]
    policy = default_tolerance_policy(first.kind, effects=control is not None)
    if "*" in policy:  # one rule for every metric (CPU probes: exact)
        policy = {name: policy["*"] for name in sorted({n for row in rows for n in row.values})}
    # A previous golden's rules (tuned by hand for this recipe) win over the defaults.
    policy.update({name: rule for name, rule in (tolerance or {}).items() if name in policy})
    golden = Golden(
        kind=first.kind,
        recipe=first.workload.recipe,
        hardware=first.hardware.profile(),
        pins=first.pins(),
        provenance={
            **provenance,
            "versions": first.revisions.to_json(),
            "records": [r.id for r in every_record],
        },
        tolerance=policy,
        rows=rows,
        peak_scope=scope,
        workload=identity[4],
        environment=identity[5],
    )
    validate_golden(golden.to_json(), "new golden")
    return golden


# The numeric keys of a tolerance rule, by its mode (the registry's TOLERANCE_KEYS).
_RULE_JSON = {
    mode: ObjectShape(
        (
            ("mode", str, True),
            *((key, Annotated[float, NON_NEGATIVE], True) for key in needed),
            *(
                (key, Annotated[float, NON_NEGATIVE], False)
                for key in OPTIONAL_TOLERANCE_KEYS.get(mode, ())
            ),
        )
    )
    for mode, needed in TOLERANCE_KEYS.items()
}
_ENVELOPE = ("schema", "schema_version")


def _required_metrics(kind: str) -> tuple[str, ...]:
    """The values every row of a golden of ``kind`` must hold (a row without them would pass anything)."""
    if kind == "cpu-probe":
        return tuple(m.name for m in metrics_in("probe") if m.required)
    return tuple(
        name
        for name in RUN_GOLDEN_METRICS
        if any(m.required for m in METRICS if m.name == name and m.scope in ("headline", "count"))
    )


def _known_metrics(kind: str) -> frozenset[str]:
    if kind == "cpu-probe":
        return frozenset(m.name for m in metrics_in("probe"))
    return frozenset(RUN_GOLDEN_METRICS) | frozenset(EFFECT_METRICS)


def validate_golden(golden: Any, source: str) -> dict[str, Any]:
    """Return ``golden`` if well formed, else raise ``UsageError`` (one line).

    As strict as the record loader: its shape is the ``Golden`` model's, then a known metric per value
    and rule, each row's label the name of its recompute fields, a configuration at most once, every
    required metric present, a pinned Megatron Core.
    """

    def fail(problem: str) -> NoReturn:
        raise UsageError(f"{source}: {problem}")

    if not isinstance(golden, dict) or golden.get("schema") != GOLDEN_SCHEMA:
        fail(f"not a golden file (expected schema {GOLDEN_SCHEMA!r})")
    version = golden.get("schema_version")
    if isinstance(version, bool) or version != GOLDEN_SCHEMA_VERSION:  # `true == 1` in Python
        fail(
            f"unknown golden schema version {version!r}; this harness reads {GOLDEN_SCHEMA_VERSION}"
        )
    check_json(
        Golden, {k: v for k, v in golden.items() if k not in _ENVELOPE}, source, name="golden"
    )
    kind, tolerance, rows = golden["kind"], golden["tolerance"], golden["rows"]
    mcore = golden["pins"]["megatron_core"]
    if not (mcore["commit"] or (mcore["version"] and mcore["fingerprint"])):
        fail(
            "pins.megatron_core: needs a commit, or a version and a fingerprint (a golden must be pinned)"
        )
    if not isinstance(golden["provenance"].get("source"), str):
        fail("provenance: needs a source")
    known = _known_metrics(kind)
    for metric, rule in tolerance.items():
        if metric not in known:
            fail(f"tolerance.{metric}: not a metric of a {kind} golden")
        if not isinstance(rule.get("mode"), str) or rule["mode"] not in TOLERANCE_KEYS:
            fail(f"tolerance.{metric}: mode must be one of {', '.join(TOLERANCE_KEYS)}")
        check_json(_RULE_JSON[rule["mode"]], rule, source, f"tolerance.{metric}")
    if not rows:
        fail("rows: expected a non-empty array")
    labels: dict[str, int] = {}
    configurations: dict[tuple, int] = {}
    required = _required_metrics(kind)
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        fields = RecomputeFields.from_dict(row["recompute"])
        if row["label"] != fields.name:
            fail(
                f"{where}.label {row['label']!r} contradicts its recompute fields (they name {fields.name!r})"
            )
        if row["label"] in labels:
            fail(f"{where}: duplicated row {row['label']!r} (also rows[{labels[row['label']]}])")
        labels[row["label"]] = i
        configuration = tuple(sorted((k, json.dumps(v)) for k, v in row["recompute"].items()))
        if configuration in configurations:
            fail(f"{where}: the same configuration as rows[{configurations[configuration]}]")
        configurations[configuration] = i
        values = row["values"]
        missing = [name for name in required if name not in values]
        if missing:
            fail(
                f"{where}.values: missing {', '.join(missing)} (a row without its metrics would pass anything)"
            )
        for metric, value in values.items():
            if metric not in known:
                fail(f"{where}.values.{metric}: not a metric of a {kind} golden")
            # Effects are differences against [] (a cost can be negative); measurements are not.
            if metric not in EFFECT_METRICS:
                check_json(_MEASURED_VALUE, value, source, f"{where}.values.{metric}")
            if metric not in tolerance:
                fail(f"{where}.values.{metric}: no tolerance rule for this metric")
    timed = [row["step_time"] for row in rows if row.get("step_time") is not None]
    if len({len(part) for found in timed for part in found.values()}) > 1:
        fail("rows[].step_time: every row holds the same number of rounds in each list")
    with_effects = [
        row["label"] for row in rows if any(name in row["values"] for name in EFFECT_METRICS)
    ]
    if with_effects and not any(_is_control_row(row) for row in rows):
        fail(
            f"rows {', '.join(with_effects)} hold effects against [] but the golden has no [] control row"
        )
    return golden


_MEASURED_VALUE = Annotated[float | None, NON_NEGATIVE]


def _is_control_row(row: dict[str, Any]) -> bool:
    return RecomputeFields.from_dict(row["recompute"]).is_control
