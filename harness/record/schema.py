"""The run record, version 1: its identity, closed sets, and the invariants its types cannot state.

A record's shape is its typed model's (``harness.record.model``: ``validate_record`` checks a record
against the annotations through ``harness.typed_json``). What is left here crosses fields: what a
record of one kind must state that another may leave null, and that a headline is what its per-rank
peaks give. Every failure is one ``UsageError`` line naming the source and the JSON path.
docs/run-record.md documents each field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, NoReturn

from harness.errors import UsageError
from harness.record.metrics import MetricName, metrics_in
from harness.record.vocabulary import (
    KIND_VALUES,
    PEAK_SCOPE_VALUES,
    PHASE_VALUES,
    STATUS_VALUES,
    RecordKind,
)
from harness.typed_json import NON_NEGATIVE, check_json

SCHEMA = "recompute-harness/run-record"
SCHEMA_VERSION = 1

# The closed sets, declared once (harness.record.vocabulary); PHASES in the order a step reaches them.
KINDS = KIND_VALUES
BACKENDS = ("bridge", "mcore", "cpu-probe")
STATUSES = STATUS_VALUES
PHASES = PHASE_VALUES
PEAK_SCOPES = PEAK_SCOPE_VALUES
# The skill's measurement contract: the headline peak is the post-optimizer peak after iteration 2.
HEADLINE_ITERATION = 2

_HEADLINE_METRICS = metrics_in("headline")
_PROBE_REQUIRED = tuple(m.name for m in metrics_in("probe") if m.required)
# A CPU probe's metrics: deterministic counts, one key per probe metric.
_PROBE_METRICS_JSON = dict[str, Annotated[float, NON_NEGATIVE]]


def _fail(source: str, path: str, problem: str) -> NoReturn:
    raise UsageError(f"{source}: {path}: {problem}")


def check_record_invariants(record: dict[str, Any], source: str) -> None:
    """What a record's kind demands of its shape-checked fields, and its date."""
    try:
        datetime.fromisoformat(record["created"])
    except ValueError:
        _fail(source, "created", f"expected an ISO-8601 date or time, got {record['created']!r}")
    kind = record["kind"]
    revisions, workload = record["revisions"], record["workload"]
    # Reference rows carry only what the source states; measured records carry their own pins.
    if kind != RecordKind.REFERENCE:
        stated = {
            "revisions.torch": revisions["torch"],
            "revisions.python": revisions["python"],
            "revisions.megatron_core.version": revisions["megatron_core"]["version"],
            "revisions.megatron_core.fingerprint": revisions["megatron_core"]["fingerprint"],
            "workload.attention_backend": workload["attention_backend"],
        }
        for path, value in stated.items():
            if value is None:
                _fail(source, path, "expected a non-empty string, got None")
    if kind == RecordKind.RUN and workload["train_iters"] is None:
        _fail(source, "workload.train_iters", "expected an integer, got None")


def check_probe_metrics(metrics: Any, source: str) -> None:
    check_json(_PROBE_METRICS_JSON, metrics, source, "metrics")
    missing = [name for name in _PROBE_REQUIRED if name not in metrics]
    if missing:
        _fail(source, "metrics", f"missing {', '.join(missing)}")


def check_run_invariants(record: dict[str, Any], source: str) -> None:
    """A run's (or reference row's) shape-checked metrics: its window, and a headline that follows
    from what it states."""
    metrics = record["metrics"]
    window, headline = metrics["steady_window"], metrics["headline"]
    if window is not None and window["last"] < window["first"]:
        _fail(
            source,
            "metrics.steady_window.last",
            f"expected an integer >= {window['first']}, got {window['last']}",
        )
    # A source may state a peak without its iteration (reference rows); a measured run always knows it.
    if (
        record["kind"] == RecordKind.RUN
        and headline[MetricName.PEAK_ALLOCATED_BYTES] is not None
        and headline[MetricName.PEAK_AFTER_ITERATION] is None
    ):
        _fail(
            source,
            "metrics.headline.peak_after_iteration",
            "a headline peak needs the iteration it was read after",
        )
    if headline[MetricName.STEP_TIME_MS] is not None and window is None and metrics["iterations"]:
        _fail(
            source,
            "metrics.steady_window",
            "a measured step time needs the steady window it averages",
        )
    _check_headline_matches_ranks(source, headline, metrics["ranks"])


def _check_headline_matches_ranks(source: str, headline: dict, ranks: list) -> None:
    """With per-rank data, every headline metric derived from the ranks must be what they give (no hand edits)."""
    at = headline[MetricName.PEAK_AFTER_ITERATION]
    if not ranks or at is None:
        return
    readings = [
        {
            peak["iteration"]: (
                peak[MetricName.ALLOCATED_BYTES],
                peak[MetricName.RESERVED_BYTES],
                peak.get(MetricName.ALLOCATED_AFTER_STEP_BYTES),
                peak.get(MetricName.ALLOCATED_AFTER_ZERO_GRAD_BYTES),
            )
            for peak in rank["peaks"]
        }
        for rank in ranks
    ]
    if any(at not in rank for rank in readings):
        _fail(
            source,
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
            _fail(
                source,
                f"metrics.headline.{metric.name}",
                f"{stated} is not what the per-rank peaks give ({derived}: {metric.description})",
            )
