"""The run record, version 1: one JSON object per run, CPU-probe row or transcribed reference row.

``validate_record`` is the one gate every record passes on its way in (loader) and out (writer). It
checks shape, types and the invariants a comparator relies on, and reports the first problem on one
line as a ``UsageError`` naming the file and the JSON path. docs/run-record.md documents each field.
"""

from __future__ import annotations

import math
from datetime import datetime
from functools import cache
from typing import Any

from harness.errors import UsageError
from harness.record.metrics import metrics_in
from harness.record.vocabulary import KIND_VALUES, PEAK_SCOPE_VALUES, PHASE_VALUES, STATUS_VALUES

SCHEMA = "recompute-harness/run-record"
SCHEMA_VERSION = 1

# The closed sets, declared once (harness.record.vocabulary); PHASES in the order a step reaches them.
KINDS = KIND_VALUES
BACKENDS = ("bridge", "mcore", "cpu-probe")
STATUSES = STATUS_VALUES
PHASES = PHASE_VALUES
PEAK_SCOPES = PEAK_SCOPE_VALUES
PARALLELISM_KEYS = ("tp", "pp", "cp", "ep", "dp", "expert_dp", "vpp")
RECOMPUTE_KEYS = (
    "recompute_granularity",
    "recompute_modules",
    "recompute_method",
    "recompute_num_layers",
)
# The skill's measurement contract: the headline peak is the post-optimizer peak after iteration 2.
HEADLINE_ITERATION = 2

_HEADLINE_METRICS = metrics_in("headline")
_HEADLINE_REQUIRED = tuple(m.name for m in _HEADLINE_METRICS if m.required) + (
    "peak_rank",
    "peak_scope",
)
_HEADLINE_OPTIONAL = tuple(m.name for m in _HEADLINE_METRICS if not m.required)
_PROBE_REQUIRED = tuple(m.name for m in metrics_in("probe") if m.required)
_PEAK_KEYS = ("iteration", *(m.name for m in metrics_in("per-rank") if m.required))
_PEAK_OPTIONAL = tuple(m.name for m in metrics_in("per-rank") if not m.required)
_ITERATION_KEYS = ("iteration", *(m.name for m in metrics_in("per-iteration")), "skipped", "nan")
_ITERATION_MEASURES = tuple(m.name for m in metrics_in("per-iteration") if m.better != "exact")
# The same keys as sets, for the fast path that checks the bulk of a record's rows.
_PEAK_KEY_SETS = (frozenset(_PEAK_KEYS), frozenset(_PEAK_KEYS + _PEAK_OPTIONAL))
_ITERATION_KEY_SET = frozenset(_ITERATION_KEYS)

TOP_LEVEL_KEYS = (
    "schema",
    "schema_version",
    "kind",
    "id",
    "created",
    "revisions",
    "hardware",
    "workload",
    "recompute",
    "metrics",
    "outcome",
)
OPTIONAL_TOP_LEVEL_KEYS = ("provenance",)


class Checker:
    """Walks one record; every failure names the source and the JSON path, on one line."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> None:
        raise UsageError(f"{self.source}: {path}: {problem}")

    def obj(
        self, value: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"expected an object, got {_type_name(value)}")
        if value.keys() == _key_set(
            required
        ):  # the common case, checked fast (1,000 records <= 2 s)
            return value
        missing = [key for key in required if key not in value]
        if missing:
            self.fail(path, f"missing {', '.join(missing)}")
        unknown = sorted(set(value) - set(required) - set(optional))
        if unknown:
            self.fail(path, f"unknown key(s) {', '.join(unknown)}")
        return value

    def string(
        self, value: Any, path: str, nullable: bool = False, choices: tuple[str, ...] = ()
    ) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, str) or not value:
            self.fail(path, f"expected a non-empty string, got {value!r}")
        if choices and value not in choices:
            self.fail(path, f"{value!r} is not one of {', '.join(choices)}")

    def integer(self, value: Any, path: str, nullable: bool = False, minimum: int = 0) -> None:
        if value is None and nullable:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {value!r}")
        if value < minimum:
            self.fail(path, f"expected an integer >= {minimum}, got {value}")

    def number(
        self, value: Any, path: str, nullable: bool = False, minimum: float | None = 0.0
    ) -> None:
        if value is None and nullable:
            return
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            self.fail(path, f"expected a finite number, got {value!r}")
        if minimum is not None and value < minimum:
            self.fail(path, f"expected a number >= {minimum}, got {value}")

    def boolean(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {value!r}")

    def array(self, value: Any, path: str) -> list:
        if not isinstance(value, list):
            self.fail(path, f"expected an array, got {_type_name(value)}")
        return value


@cache
def _key_set(keys: tuple[str, ...]) -> frozenset[str]:
    return frozenset(keys)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_measure(value: Any) -> bool:
    """null or a finite, non-negative float (the common shape of a timing)."""
    return value is None or (type(value) is float and math.isfinite(value) and value >= 0)


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def validate_record(record: Any, source: str = "record") -> dict[str, Any]:
    """Return ``record`` unchanged if it is a valid version-1 run record; else raise ``UsageError``."""
    check = Checker(source)
    if not isinstance(record, dict):
        check.fail("$", f"expected a run-record object, got {_type_name(record)}")
    if record.get("schema") != SCHEMA:
        check.fail(
            "schema", f"expected {SCHEMA!r}, got {record.get('schema')!r} (not a run record)"
        )
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        check.fail(
            "schema_version",
            f"unknown schema version {version!r}; this harness reads version {SCHEMA_VERSION}",
        )
    check.obj(record, "$", TOP_LEVEL_KEYS, OPTIONAL_TOP_LEVEL_KEYS)
    kind = record["kind"]
    check.string(kind, "kind", choices=KINDS)
    check.string(record["id"], "id")
    check.string(record["created"], "created")
    try:
        datetime.fromisoformat(record["created"])
    except ValueError:
        check.fail("created", f"expected an ISO-8601 date or time, got {record['created']!r}")
    _check_revisions(check, record["revisions"], kind)
    _check_hardware(check, record["hardware"])
    _check_workload(check, record["workload"], kind)
    check_recompute(check, record["recompute"])
    if kind == "cpu-probe":
        _check_cpu_probe_metrics(check, record["metrics"])
    else:
        _check_run_metrics(check, record["metrics"], kind)
    _check_outcome(check, record["outcome"])
    if "provenance" in record:
        check.obj(
            record["provenance"],
            "provenance",
            ("source",),
            ("command", "host", "date", "card", "study", "row", "notes"),
        )
        for key, value in record["provenance"].items():
            check.string(value, f"provenance.{key}", nullable=key != "source")
    return record


def _check_revisions(check: Checker, revisions: Any, kind: str) -> None:
    check.obj(
        revisions,
        "revisions",
        (
            "torch",
            "megatron_core",
            "megatron_bridge",
            "transformer_engine",
            "cuda",
            "driver",
            "python",
        ),
    )
    # Reference rows carry only what the source states; measured records carry their own pins.
    measured = kind != "reference"
    # ``package``: what package metadata claimed, recorded only when it disagreed with the imported code.
    mcore = check.obj(
        revisions["megatron_core"],
        "revisions.megatron_core",
        ("version", "commit", "fingerprint"),
        ("package",),
    )
    if "package" in mcore:
        package = check.obj(
            mcore["package"], "revisions.megatron_core.package", ("version", "commit")
        )
        check.string(package["version"], "revisions.megatron_core.package.version", nullable=True)
        check.string(package["commit"], "revisions.megatron_core.package.commit", nullable=True)
    for key in ("version", "commit", "fingerprint"):
        check.string(
            mcore[key], f"revisions.megatron_core.{key}", nullable=not measured or key == "commit"
        )
    if revisions["megatron_bridge"] is not None:
        bridge = check.obj(
            revisions["megatron_bridge"], "revisions.megatron_bridge", ("version", "commit")
        )
        check.string(bridge["version"], "revisions.megatron_bridge.version", nullable=True)
        check.string(bridge["commit"], "revisions.megatron_bridge.commit", nullable=True)
    check.string(revisions["torch"], "revisions.torch", nullable=not measured)
    check.string(revisions["python"], "revisions.python", nullable=not measured)
    for key in ("transformer_engine", "cuda", "driver"):
        check.string(revisions[key], f"revisions.{key}", nullable=True)


def _check_hardware(check: Checker, hardware: Any) -> None:
    check.obj(hardware, "hardware", ("device", "gpu_count", "sm", "host"))
    check.string(hardware["device"], "hardware.device")
    check.integer(hardware["gpu_count"], "hardware.gpu_count")
    check.string(hardware["sm"], "hardware.sm", nullable=True)
    check.string(hardware["host"], "hardware.host", nullable=True)


def _check_workload(check: Checker, workload: Any, kind: str) -> None:
    check.obj(
        workload,
        "workload",
        (
            "recipe",
            "model",
            "backend",
            "seq_length",
            "micro_batch_size",
            "global_batch_size",
            "precision",
            "attention_backend",
            "train_iters",
            "parallelism",
        ),
        ("extra",),
    )
    check.string(workload["recipe"], "workload.recipe")
    check.string(workload["model"], "workload.model")
    check.string(workload["backend"], "workload.backend", choices=BACKENDS)
    for key in ("seq_length", "micro_batch_size", "global_batch_size"):
        check.integer(workload[key], f"workload.{key}", minimum=1)
    check.string(workload["precision"], "workload.precision")
    check.string(
        workload["attention_backend"], "workload.attention_backend", nullable=kind == "reference"
    )
    check.integer(workload["train_iters"], "workload.train_iters", nullable=kind != "run")
    parallelism = check.obj(workload["parallelism"], "workload.parallelism", PARALLELISM_KEYS)
    for key in PARALLELISM_KEYS:
        # vpp and expert_dp are null when unused or (reference rows) not stated by the source.
        check.integer(
            parallelism[key],
            f"workload.parallelism.{key}",
            nullable=key in ("vpp", "expert_dp"),
            minimum=1,
        )
    if "extra" in workload:
        if not isinstance(workload["extra"], dict):
            check.fail("workload.extra", f"expected an object, got {_type_name(workload['extra'])}")
        for key, value in workload["extra"].items():
            check.string(value, f"workload.extra.{key}")


def check_recompute(check: Checker, recompute: Any) -> None:
    check.obj(recompute, "recompute", RECOMPUTE_KEYS)
    check.string(
        recompute["recompute_granularity"], "recompute.recompute_granularity", nullable=True
    )
    modules = recompute["recompute_modules"]
    if modules is not None:
        check.array(modules, "recompute.recompute_modules")
        for i, label in enumerate(modules):
            check.string(label, f"recompute.recompute_modules[{i}]")
        if len(set(modules)) != len(modules):
            check.fail("recompute.recompute_modules", f"duplicated label in {modules}")
    check.string(recompute["recompute_method"], "recompute.recompute_method", nullable=True)
    check.integer(
        recompute["recompute_num_layers"], "recompute.recompute_num_layers", nullable=True
    )


def _check_run_metrics(check: Checker, metrics: Any, kind: str) -> None:
    check.obj(
        metrics,
        "metrics",
        (
            "iterations",
            "ranks",
            "steady_window",
            "headline",
            "skipped_iterations",
            "nan_iterations",
        ),
    )
    seen: set[int] = set()
    for i, row in enumerate(check.array(metrics["iterations"], "metrics.iterations")):
        if (
            type(row) is dict
            and row.keys() == _ITERATION_KEY_SET
            and _is_count(row["iteration"])
            and row["iteration"] >= 1
            and row["iteration"] not in seen
            and type(row["skipped"]) is bool
            and type(row["nan"]) is bool
            and all(_is_measure(row[key]) for key in _ITERATION_MEASURES)
            and (row["loss"] is None or (type(row["loss"]) is float and math.isfinite(row["loss"])))
        ):
            seen.add(row["iteration"])  # fast path for the bulk of a record
            continue
        path = f"metrics.iterations[{i}]"
        check.obj(row, path, _ITERATION_KEYS)
        check.integer(row["iteration"], f"{path}.iteration", minimum=1)
        if row["iteration"] in seen:
            check.fail(path, f"duplicated row for iteration {row['iteration']}")
        seen.add(row["iteration"])
        check.number(row["step_time_ms"], f"{path}.step_time_ms", nullable=True)
        # A NaN loss is recorded as loss=null with nan=true: the file itself never holds NaN.
        check.number(row["loss"], f"{path}.loss", nullable=True, minimum=None)
        check.number(row["tflops_per_gpu"], f"{path}.tflops_per_gpu", nullable=True)
        check.boolean(row["skipped"], f"{path}.skipped")
        check.boolean(row["nan"], f"{path}.nan")
    ranks_seen: set[int] = set()
    for i, rank in enumerate(check.array(metrics["ranks"], "metrics.ranks")):
        path = f"metrics.ranks[{i}]"
        check.obj(rank, path, ("rank", "peaks"))
        check.integer(rank["rank"], f"{path}.rank")
        if rank["rank"] in ranks_seen:
            check.fail(path, f"duplicated row for rank {rank['rank']}")
        ranks_seen.add(rank["rank"])
        peak_iterations: set[int] = set()
        for j, peak in enumerate(check.array(rank["peaks"], f"{path}.peaks")):
            if (
                type(peak) is dict
                and peak.keys() in _PEAK_KEY_SETS
                and _is_count(peak["iteration"])
                and _is_count(peak["allocated_bytes"])
                and _is_count(peak["reserved_bytes"])
                and _is_count(peak.get("device_used_bytes", 0))
                and peak["iteration"] not in peak_iterations
            ):
                peak_iterations.add(peak["iteration"])  # fast path for the bulk of a record
                continue
            ppath = f"{path}.peaks[{j}]"
            check.obj(peak, ppath, _PEAK_KEYS, _PEAK_OPTIONAL)
            check.integer(peak["iteration"], f"{ppath}.iteration")
            if peak["iteration"] in peak_iterations:
                check.fail(ppath, f"duplicated row for iteration {peak['iteration']}")
            peak_iterations.add(peak["iteration"])
            check.integer(peak["allocated_bytes"], f"{ppath}.allocated_bytes")
            check.integer(peak["reserved_bytes"], f"{ppath}.reserved_bytes", nullable=True)
            for name in _PEAK_OPTIONAL:
                if name in peak:
                    check.integer(peak[name], f"{ppath}.{name}", nullable=True)
    window = metrics["steady_window"]
    if window is not None:
        check.obj(window, "metrics.steady_window", ("first", "last"))
        check.integer(window["first"], "metrics.steady_window.first", minimum=1)
        check.integer(window["last"], "metrics.steady_window.last", minimum=window["first"])
    headline = check.obj(
        metrics["headline"], "metrics.headline", _HEADLINE_REQUIRED, _HEADLINE_OPTIONAL
    )
    for metric in _HEADLINE_METRICS:
        name = metric.name
        if metric.unit == "bytes" or metric.unit == "iterations":
            check.integer(headline.get(name), f"metrics.headline.{name}", nullable=True)
        else:
            check.number(headline.get(name), f"metrics.headline.{name}", nullable=True)
    check.integer(headline["peak_rank"], "metrics.headline.peak_rank", nullable=True)
    check.string(headline["peak_scope"], "metrics.headline.peak_scope", choices=PEAK_SCOPES)
    # A source may state a peak without its iteration (reference rows); a measured run always knows it.
    if (
        kind == "run"
        and headline["peak_allocated_bytes"] is not None
        and headline["peak_after_iteration"] is None
    ):
        check.fail(
            "metrics.headline.peak_after_iteration",
            "a headline peak needs the iteration it was read after",
        )
    if headline["step_time_ms"] is not None and window is None and metrics["iterations"]:
        check.fail(
            "metrics.steady_window", "a measured step time needs the steady window it averages"
        )
    _check_headline_matches_ranks(check, headline, metrics["ranks"])
    check.integer(metrics["skipped_iterations"], "metrics.skipped_iterations", nullable=True)
    check.integer(metrics["nan_iterations"], "metrics.nan_iterations", nullable=True)


def _check_headline_matches_ranks(check: Checker, headline: dict, ranks: list) -> None:
    """With per-rank data, every headline metric derived from the ranks must be what they give (no hand edits)."""
    at = headline["peak_after_iteration"]
    if not ranks or at is None:
        return
    readings = [
        {
            peak["iteration"]: (
                peak["allocated_bytes"],
                peak["reserved_bytes"],
                peak.get("allocated_after_step_bytes"),
                peak.get("allocated_after_zero_grad_bytes"),
            )
            for peak in rank["peaks"]
        }
        for rank in ranks
    ]
    if any(at not in rank for rank in readings):
        check.fail(
            "metrics.headline.peak_after_iteration",
            f"not every rank reported a peak after iteration {at}",
        )
    last = max(set.intersection(*(set(rank) for rank in readings)))
    for metric in _HEADLINE_METRICS:
        stated = headline.get(metric.name)
        if metric.from_ranks is None or stated is None:
            continue
        derived = metric.from_ranks(readings, at, last)
        if stated != derived:
            check.fail(
                f"metrics.headline.{metric.name}",
                f"{stated} is not what the per-rank peaks give ({derived}: {metric.description})",
            )


def _check_cpu_probe_metrics(check: Checker, metrics: Any) -> None:
    if not isinstance(metrics, dict):
        check.fail("metrics", f"expected an object, got {_type_name(metrics)}")
    missing = [name for name in _PROBE_REQUIRED if name not in metrics]
    if missing:
        check.fail("metrics", f"missing {', '.join(missing)}")
    for name, value in metrics.items():
        check.number(value, f"metrics.{name}")


def _check_outcome(check: Checker, outcome: Any) -> None:
    check.obj(outcome, "outcome", ("status", "iteration", "phase", "ranks", "message"), ("site",))
    check.string(outcome["status"], "outcome.status", choices=STATUSES)
    check.integer(outcome["iteration"], "outcome.iteration", nullable=True)
    check.string(outcome["phase"], "outcome.phase", nullable=True, choices=PHASES)
    for i, rank in enumerate(check.array(outcome["ranks"], "outcome.ranks")):
        check.integer(rank, f"outcome.ranks[{i}]")
    if not isinstance(outcome["message"], str):
        check.fail("outcome.message", f"expected a string, got {outcome['message']!r}")
    if "site" in outcome:
        check.string(outcome["site"], "outcome.site", nullable=True)
