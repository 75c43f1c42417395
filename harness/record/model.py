"""The run record as typed values, from the runner to the reports, and the schema they declare.

``Record.from_json`` is the only way in (it validates first: ``validate_record``) and
``Record.to_json`` the only way out; everything between works on attributes. The JSON layout (key
order included) is the one schema v1 has always written, so a record or golden written before these
types existed loads, compares and re-serialises unchanged.

The types are the schema: ``validate_record`` checks a record's shape against them
(``harness.typed_json``: each field's constraints sit in its ``field(metadata=rules(...))``), then
the invariants no type states (``harness.record.schema``). docs/run-record.md documents each field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Required, TypedDict

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.record.metrics import metrics_in
from harness.record.schema import (
    BACKENDS,
    SCHEMA,
    SCHEMA_VERSION,
    check_probe_metrics,
    check_record_invariants,
    check_run_invariants,
)
from harness.record.vocabulary import PEAK_SCOPE_VALUES, RecordKind, RunStatus, StepPhase
from harness.typed_json import NON_NEGATIVE, ObjectShape, Rules, check_json, rules, type_name

Number = int | float


@dataclass
class BridgeRevision:
    """A package's version and commit (Megatron Bridge; also what a package's metadata claims)."""

    version: str | None
    commit: str | None

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "commit": self.commit}


@dataclass
class CoreRevision:
    version: str | None
    commit: str | None
    fingerprint: str | None
    # What package metadata claimed ({version, commit}), only when it disagreed with the imported code.
    package: dict[str, str | None] | None = field(
        default=None, metadata=rules(shape=BridgeRevision | None)
    )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": self.version,
            "commit": self.commit,
            "fingerprint": self.fingerprint,
        }
        if self.package is not None:
            data["package"] = dict(self.package)
        return data


# The revisions a golden is pinned to (driver, python and host are provenance, not pins).
PIN_KEYS = ("megatron_core", "megatron_bridge", "torch", "transformer_engine", "cuda")


@dataclass
class Revisions:
    torch: str | None
    megatron_core: CoreRevision
    megatron_bridge: BridgeRevision | None
    transformer_engine: str | None
    cuda: str | None
    driver: str | None
    python: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Revisions:
        bridge = data["megatron_bridge"]
        return cls(
            torch=data["torch"],
            megatron_core=CoreRevision(**data["megatron_core"]),
            megatron_bridge=None if bridge is None else BridgeRevision(**bridge),
            transformer_engine=data["transformer_engine"],
            cuda=data["cuda"],
            driver=data["driver"],
            python=data["python"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "megatron_core": self.megatron_core.to_json(),
            "megatron_bridge": None
            if self.megatron_bridge is None
            else self.megatron_bridge.to_json(),
            "transformer_engine": self.transformer_engine,
            "cuda": self.cuda,
            "driver": self.driver,
            "python": self.python,
        }

    def pins(self) -> dict[str, Any]:
        """What a golden is pinned to. The metadata's claim next to a Megatron Core tree that shadows
        the installed wheel (``megatron_core.package``, e.g. a Megatron-LM checkout on PYTHONPATH)
        says how the code was found, not which code it is: it stays in the record, not the pins."""
        data = self.to_json()
        data["megatron_core"].pop("package", None)
        return {key: data[key] for key in PIN_KEYS}


@dataclass
class Hardware:
    device: str  # GPU profile (``H100_80GB``), ``cpu`` or ``unidentified``
    gpu_count: int = field(metadata=rules(minimum=0))
    sm: str | None
    host: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "gpu_count": self.gpu_count,
            "sm": self.sm,
            "host": self.host,
        }

    def profile(self) -> dict[str, Any]:
        """What a golden's hardware is: the device model and how many (the host is provenance)."""
        return {"device": self.device, "gpu_count": self.gpu_count}


@dataclass
class ParallelLayout:
    tp: int = field(metadata=rules(minimum=1))
    pp: int = field(metadata=rules(minimum=1))
    cp: int = field(metadata=rules(minimum=1))
    ep: int = field(metadata=rules(minimum=1))
    dp: int = field(metadata=rules(minimum=1))
    # Null when unused or (reference rows) not stated by the source.
    expert_dp: int | None = field(metadata=rules(minimum=1))
    vpp: int | None = field(metadata=rules(minimum=1))

    def to_json(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "ep": self.ep,
            "dp": self.dp,
            "expert_dp": self.expert_dp,
            "vpp": self.vpp,
        }


@dataclass
class Workload:
    recipe: str
    model: str
    backend: str = field(metadata=rules(one_of=BACKENDS))
    seq_length: int = field(metadata=rules(minimum=1))
    micro_batch_size: int = field(metadata=rules(minimum=1))
    global_batch_size: int = field(metadata=rules(minimum=1))
    precision: str
    attention_backend: str | None  # null only in a reference row (harness.record.schema)
    train_iters: int | None = field(metadata=rules(minimum=0))  # null only if not a run's
    parallelism: ParallelLayout
    extra: dict[str, str] = field(default_factory=dict)
    # The variables that change allocator, dispatcher, kernels or graphs, as the ranks ran them
    # (harness.run.environment); None (no key) in records written before they were recorded and in
    # kinds that run nothing under torchrun.
    environment: dict[str, str] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        values = {
            key: value
            for key, value in data.items()
            if key not in ("parallelism", "extra", "environment")
        }
        environment = data.get("environment")
        return cls(
            **values,
            parallelism=ParallelLayout(**data["parallelism"]),
            extra=dict(data.get("extra", {})),
            environment=None if environment is None else dict(environment),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "recipe": self.recipe,
            "model": self.model,
            "backend": self.backend,
            "seq_length": self.seq_length,
            "micro_batch_size": self.micro_batch_size,
            "global_batch_size": self.global_batch_size,
            "precision": self.precision,
            "attention_backend": self.attention_backend,
            "train_iters": self.train_iters,
            "parallelism": self.parallelism.to_json(),
        }
        if self.extra:
            data["extra"] = dict(self.extra)
        if self.environment is not None:
            data["environment"] = dict(self.environment)
        return data


@dataclass(slots=True)
class IterationRow:
    iteration: int = field(metadata=rules(minimum=1))
    step_time_ms: float | None = field(metadata=rules(minimum=0))
    loss: float | None  # None with ``nan=True`` for a NaN/inf loss: files never hold NaN
    tflops_per_gpu: float | None = field(metadata=rules(minimum=0))
    skipped: bool
    nan: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "step_time_ms": self.step_time_ms,
            "loss": self.loss,
            "tflops_per_gpu": self.tflops_per_gpu,
            "skipped": self.skipped,
            "nan": self.nan,
        }


@dataclass(slots=True)
class PeakReading:
    iteration: int = field(metadata=rules(minimum=0))
    allocated_bytes: int = field(metadata=rules(minimum=0))
    reserved_bytes: int | None = field(metadata=rules(minimum=0))
    # memory_allocated() after the optimizer step / after zero_grad; optional keys (newer than v1's first files)
    allocated_after_step_bytes: int | None = field(default=None, metadata=rules(minimum=0))
    allocated_after_zero_grad_bytes: int | None = field(default=None, metadata=rules(minimum=0))
    # Optional (metrics registry): mem_get_info's total - free.
    device_used_bytes: int | None = field(default=None, metadata=rules(minimum=0))
    # Optional: the peaks of this iteration alone (statistics reset at its start); the two above are
    # the run's high-water marks through it.
    iteration_allocated_bytes: int | None = field(default=None, metadata=rules(minimum=0))
    iteration_reserved_bytes: int | None = field(default=None, metadata=rules(minimum=0))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "iteration": self.iteration,
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
        }
        if self.allocated_after_step_bytes is not None:
            data["allocated_after_step_bytes"] = self.allocated_after_step_bytes
        if self.allocated_after_zero_grad_bytes is not None:
            data["allocated_after_zero_grad_bytes"] = self.allocated_after_zero_grad_bytes
        if self.device_used_bytes is not None:
            data["device_used_bytes"] = self.device_used_bytes
        if self.iteration_allocated_bytes is not None:
            data["iteration_allocated_bytes"] = self.iteration_allocated_bytes
        if self.iteration_reserved_bytes is not None:
            data["iteration_reserved_bytes"] = self.iteration_reserved_bytes
        return data

    def reading(self) -> tuple[int, int | None, int | None, int | None]:
        """The tuple a registry ``from_ranks`` function reads (harness.record.metrics.RankReadings)."""
        return (
            self.allocated_bytes,
            self.reserved_bytes,
            self.allocated_after_step_bytes,
            self.allocated_after_zero_grad_bytes,
        )


@dataclass
class RankPeaks:
    """A rank's allocator peaks read after each iteration's optimizer step."""

    rank: int = field(metadata=rules(minimum=0))
    peaks: list[PeakReading] = field(metadata=rules(unique_by="iteration"))

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "peaks": [peak.to_json() for peak in self.peaks]}

    def at(self, iteration: int) -> PeakReading | None:
        return next((peak for peak in self.peaks if peak.iteration == iteration), None)


@dataclass
class SteadyWindow:
    first: int = field(metadata=rules(minimum=1))
    last: int = field(metadata=rules(minimum=1))  # and >= first (harness.record.schema)

    def to_json(self) -> dict[str, int]:
        return {"first": self.first, "last": self.last}


# The structural headline keys, and where they sit among the metrics in the JSON object.
_HEADLINE_STRUCTURE = {"peak_rank": "peak_reserved_bytes", "peak_scope": "peak_after_iteration"}
# A headline in JSON: one key per headline metric of the registry (the required ones required; bytes
# and iterations are integers), then the structural keys.
_HEADLINE_COUNT = Annotated[int | None, NON_NEGATIVE]
_HEADLINE_MEASURE = Annotated[float | None, NON_NEGATIVE]
HEADLINE_JSON = ObjectShape(
    (
        *(
            (
                metric.name,
                _HEADLINE_COUNT if metric.unit in ("bytes", "iterations") else _HEADLINE_MEASURE,
                metric.required,
            )
            for metric in metrics_in("headline")
        ),
        ("peak_rank", _HEADLINE_COUNT, True),
        ("peak_scope", Annotated[str, Rules(one_of=PEAK_SCOPE_VALUES)], True),
    )
)


@dataclass
class Headline:
    """The numbers a verdict is made on: every headline metric of the registry the record holds."""

    values: dict[str, Number | None]
    peak_rank: int | None
    peak_scope: str  # one of harness.record.vocabulary.PeakScope

    def __getitem__(self, name: str) -> Number | None:
        return self.values.get(name)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Headline:
        values = {key: value for key, value in data.items() if key not in _HEADLINE_STRUCTURE}
        return cls(values=values, peak_rank=data["peak_rank"], peak_scope=data["peak_scope"])

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for metric in metrics_in("headline"):
            if metric.name in self.values:
                data[metric.name] = self.values[metric.name]
            for key, after in _HEADLINE_STRUCTURE.items():
                if after == metric.name:
                    data[key] = getattr(self, key)
        return data


@dataclass
class RunMetrics:
    """Metrics of a GPU run (or a transcribed reference row, which states only the headline)."""

    iterations: list[IterationRow] = field(metadata=rules(unique_by="iteration"))
    ranks: list[RankPeaks] = field(metadata=rules(unique_by="rank"))
    steady_window: SteadyWindow | None
    headline: Headline = field(metadata=rules(shape=HEADLINE_JSON))
    skipped_iterations: int | None = field(metadata=rules(minimum=0))
    nan_iterations: int | None = field(metadata=rules(minimum=0))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunMetrics:
        window = data["steady_window"]
        return cls(
            # Positional: a record holds iterations × ranks of these (1,000 records load in <= 2 s).
            iterations=[
                IterationRow(
                    r["iteration"],
                    r["step_time_ms"],
                    r["loss"],
                    r["tflops_per_gpu"],
                    r["skipped"],
                    r["nan"],
                )
                for r in data["iterations"]
            ],
            ranks=[
                RankPeaks(
                    rank["rank"],
                    [
                        PeakReading(
                            p["iteration"],
                            p["allocated_bytes"],
                            p["reserved_bytes"],
                            p.get("allocated_after_step_bytes"),
                            p.get("allocated_after_zero_grad_bytes"),
                            p.get("device_used_bytes"),
                            p.get("iteration_allocated_bytes"),
                            p.get("iteration_reserved_bytes"),
                        )
                        for p in rank["peaks"]
                    ],
                )
                for rank in data["ranks"]
            ],
            steady_window=None if window is None else SteadyWindow(**window),
            headline=Headline.from_json(data["headline"]),
            skipped_iterations=data["skipped_iterations"],
            nan_iterations=data["nan_iterations"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "iterations": [row.to_json() for row in self.iterations],
            "ranks": [rank.to_json() for rank in self.ranks],
            "steady_window": None if self.steady_window is None else self.steady_window.to_json(),
            "headline": self.headline.to_json(),
            "skipped_iterations": self.skipped_iterations,
            "nan_iterations": self.nan_iterations,
        }

    def golden_values(self, names: tuple[str, ...]) -> dict[str, Number | None]:
        counts = {
            "skipped_iterations": self.skipped_iterations,
            "nan_iterations": self.nan_iterations,
        }
        return {
            name: counts[name] if name in counts else self.headline.values[name]
            for name in names
            if name in counts or name in self.headline.values
        }


@dataclass
class ProbeMetrics:
    """Metrics of one CPU-probe row: deterministic counts (registry scope ``probe``)."""

    values: dict[str, Number]

    def to_json(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass
class Outcome:
    """How the run ended: status, the iteration and phase it stopped in, the failing rank(s)."""

    # The defaults serve the constructors; in JSON every key but ``site`` is required.
    status: str = field(metadata=rules(one_of=RunStatus))
    iteration: int | None = field(default=None, metadata=rules(required=True, minimum=0))
    phase: str | None = field(default=None, metadata=rules(required=True, one_of=StepPhase))
    ranks: list[int] = field(default_factory=list, metadata=rules(required=True, minimum=0))
    message: str = field(default="", metadata=rules(required=True, empty=True))
    site: str | None = None  # where inside the phase, when the source says (e.g. ``forward``)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            status=data["status"],
            iteration=data["iteration"],
            phase=data["phase"],
            ranks=list(data["ranks"]),
            message=data["message"],
            site=data.get("site"),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": self.status,
            "iteration": self.iteration,
            "phase": self.phase,
            "ranks": list(self.ranks),
            "message": self.message,
        }
        if self.site is not None:
            data["site"] = self.site
        return data

    def stage(self) -> dict[str, Any]:
        """What a golden keeps of an outcome."""
        return {"status": self.status, "iteration": self.iteration, "phase": self.phase}


class RecordProvenance(TypedDict, total=False):
    """Where a record's numbers came from (reference rows: the study and the row transcribed)."""

    source: Required[str]
    command: str | None
    host: str | None
    date: str | None
    card: str | None
    study: str | None
    row: str | None
    notes: str | None


@dataclass
class Record:
    """One run, CPU-probe row or transcribed reference row (schema v1: docs/run-record.md)."""

    kind: str = field(metadata=rules(one_of=RecordKind))
    id: str
    created: str  # ISO 8601 (harness.record.schema)
    revisions: Revisions
    hardware: Hardware
    workload: Workload
    recompute: RecomputeFields
    # Its shape depends on the kind: validate_record checks it as RunMetrics or ProbeMetrics.
    metrics: RunMetrics | ProbeMetrics = field(metadata=rules(shape=Any))
    outcome: Outcome
    provenance: dict[str, str | None] | None = field(
        default=None, metadata=rules(shape=RecordProvenance | None)
    )

    @property
    def label(self) -> str:
        """The row name (``[]``, ``moe_act``, ``full-uniform-1``): ``RecomputeFields.name``."""
        return self.recompute.name

    @property
    def run_metrics(self) -> RunMetrics:
        assert isinstance(self.metrics, RunMetrics), (
            f"{self.id}: a {self.kind} record has no run metrics"
        )
        return self.metrics

    @property
    def headline(self) -> Headline:
        return self.run_metrics.headline

    def pins(self) -> dict[str, Any]:
        return self.revisions.pins()

    @classmethod
    def from_json(cls, data: Any, source: str = "record") -> Record:
        """Validate ``data`` (one ``UsageError`` line naming ``source`` if invalid), then type it."""
        validate_record(data, source)
        metrics = data["metrics"]
        return cls(
            kind=data["kind"],
            id=data["id"],
            created=data["created"],
            revisions=Revisions.from_json(data["revisions"]),
            hardware=Hardware(**data["hardware"]),
            workload=Workload.from_json(data["workload"]),
            recompute=RecomputeFields.from_dict(data["recompute"]),
            metrics=ProbeMetrics(dict(metrics))
            if data["kind"] == "cpu-probe"
            else RunMetrics.from_json(metrics),
            outcome=Outcome.from_json(data["outcome"]),
            provenance=None if "provenance" not in data else dict(data["provenance"]),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "kind": self.kind,
            "id": self.id,
            "created": self.created,
            "revisions": self.revisions.to_json(),
            "hardware": self.hardware.to_json(),
            "workload": self.workload.to_json(),
            "recompute": self.recompute.as_dict(),
            "metrics": self.metrics.to_json(),
            "outcome": self.outcome.to_json(),
        }
        if self.provenance is not None:
            data["provenance"] = dict(self.provenance)
        return data

    def validated(self) -> Record:
        """Re-check the record after a change (the writer calls it: an invalid record never lands)."""
        validate_record(self.to_json(), f"record {self.id}")
        return self


def validate_record(record: Any, source: str = "record") -> dict[str, Any]:
    """Return ``record`` unchanged if it is a valid version-1 run record; else raise ``UsageError``
    (one line naming ``source`` and the JSON path of the first problem)."""
    if not isinstance(record, dict):
        raise UsageError(f"{source}: $: expected a run-record object, got {type_name(record)}")
    if record.get("schema") != SCHEMA:
        raise UsageError(
            f"{source}: schema: expected {SCHEMA!r}, got {record.get('schema')!r} (not a run record)"
        )
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UsageError(
            f"{source}: schema_version: unknown schema version {version!r}; this harness reads "
            f"version {SCHEMA_VERSION}"
        )
    # schema and schema_version are the envelope, checked above; the rest is a Record.
    check_json(Record, {k: v for k, v in record.items() if k not in _ENVELOPE}, source)
    check_record_invariants(record, source)
    if record["kind"] == RecordKind.CPU_PROBE:
        check_probe_metrics(record["metrics"], source)
    else:
        check_json(RunMetrics, record["metrics"], source, "metrics")
        check_run_invariants(record, source)
    return record


_ENVELOPE = ("schema", "schema_version")
