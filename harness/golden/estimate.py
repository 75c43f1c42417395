"""Estimate goldens: ``estimate --write-golden``'s file per recipe × attention back end × MCore sources,
read back through a typed model, rewritten only when a measured value changed, and judged
(``estimate --check-golden``: every figure to the byte, each changed row named)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.estimate.estimate import Estimate
from harness.files import write_json_atomic
from harness.golden.figures import FigureMismatch
from harness.golden.store import estimate_golden_path
from harness.record.io import read_json
from harness.record.metrics import MetricName

# The keys every estimate golden holds (``Estimate.as_dict``); a file without them is not one.
REQUIRED_KEYS = ("recipe", "attention_backend", "rows", "revisions", "provenance")
REQUIRED_ROW_KEYS = ("label", "status", MetricName.RETAINED_BYTES)


@dataclass(frozen=True)
class EstimateGolden:
    """An estimate golden as read: its identity, its rows and provenance, and the whole document."""

    recipe: str
    attention_backend: str
    rows: list[dict[str, Any]]
    provenance: dict[str, Any]
    data: dict[str, Any]

    @classmethod
    def from_json(cls, data: Any, source: str) -> EstimateGolden:
        """The golden in ``data``; ``UsageError`` (one line naming ``source``) when it is not one."""
        if not isinstance(data, dict):
            raise UsageError(f"{source}: not an estimate golden (expected an object)")
        missing = [key for key in REQUIRED_KEYS if key not in data]
        if missing:
            raise UsageError(f"{source}: not an estimate golden (missing {', '.join(missing)})")
        rows = data["rows"]
        if not isinstance(rows, list) or not all(
            isinstance(row, dict) and all(key in row for key in REQUIRED_ROW_KEYS) for row in rows
        ):
            raise UsageError(
                f"{source}: rows: expected objects with {', '.join(REQUIRED_ROW_KEYS)}"
            )
        for key in ("recipe", "attention_backend"):
            if not isinstance(data[key], str):
                raise UsageError(f"{source}: {key}: expected a string")
        if not isinstance(data["provenance"], dict):
            raise UsageError(f"{source}: provenance: expected an object")
        return cls(data["recipe"], data["attention_backend"], rows, data["provenance"], data)

    def measured(self) -> dict[str, Any]:
        """Everything but the provenance: what a re-run must reproduce for the file to stay."""
        return {key: value for key, value in self.data.items() if key != "provenance"}


def estimate_golden_path_for(estimate: Estimate, root: Path | None = None) -> Path:
    """Where ``estimate``'s golden lives under the golden root (``harness.golden.store``)."""
    return estimate_golden_path(
        estimate.recipe,
        estimate.attention_backend,
        estimate.revisions.get("megatron_core") or {},
        root,
    )


def load_estimate_golden(path: Path) -> EstimateGolden:
    return EstimateGolden.from_json(read_json(Path(path)), str(path))


def write_estimate(estimate: Estimate, target: Path, *, keep_unchanged: bool) -> bool:
    """Write ``estimate``'s JSON to ``target`` atomically; whether it was written. With
    ``keep_unchanged`` (a golden) a file that holds the same measurements is left alone: only its
    provenance would differ; one that is not readable as an estimate golden is replaced."""
    data = estimate.as_dict()
    if keep_unchanged and target.is_file():
        try:
            before = load_estimate_golden(target).measured()
        except UsageError:
            before = None
        if before == {key: value for key, value in data.items() if key != "provenance"}:
            return False
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, data)
    return True


# --- estimate --check-golden: a fresh estimate judged against the golden, row by row ----------------
# The estimate's bytes are exact on CPU (real layers, deterministic shapes, rational extrapolation), so
# every judged figure must match the golden to the byte: a row whose saving, retained bytes, peak or
# status changed is a regression of what that label does at the recipe's real shapes, and is named.
# The golden's rows are what is judged: without --rows the check measures exactly the golden's rows;
# with --rows every row named must be in the golden (refused before anything is measured).

# The estimate's workload: a golden of another workload is not comparable figure by figure.
WORKLOAD_KEYS = (
    "recipe",
    "model",
    "attention_backend",
    "precision",
    "seq_length",
    "micro_batch_size",
    "parallelism",
    "hot_rank",
    "layers",
    "in_flight_microbatches",
    "probe_seq_lengths",
)
# Per row: what a label does (status) and the bytes it saves and leaves; per layer kind, the same.
ROW_KEYS = ("status", MetricName.RETAINED_BYTES, "saving_bytes", "partial_saving_bytes")
# Judged only where the golden has them: goldens written before the peaks were measured stay usable.
ROW_KEYS_SINCE = ("peak_bytes", "peak_saving_bytes", "peak_phase")
PER_KIND_KEYS = ("layers", MetricName.RETAINED_BYTES, "saving_bytes")


def golden_to_judge(path: Path) -> EstimateGolden:
    """The golden ``--check-golden`` judges against; a missing or malformed file is bad input."""
    if not Path(path).is_file():
        raise UsageError(
            f"no estimate golden {path} (write one with estimate --recipe ... --write-golden)"
        )
    return load_estimate_golden(path)


def golden_rows(golden: EstimateGolden, requested: list[str] | None, where: Path) -> list[str]:
    """The rows to measure: the golden's, or ``requested`` when each of them is in the golden."""
    labels = [row["label"] for row in golden.rows]
    if requested is None:
        return labels
    missing = [row for row in requested if RecomputeFields.parse(row).name not in labels]
    if missing:
        raise UsageError(
            f"{where} has no row {', '.join(map(repr, missing))} to judge "
            f"(its rows: {', '.join(labels)})"
        )
    return list(requested)


def judge_estimate(golden: dict[str, Any], actual: dict[str, Any]) -> list[FigureMismatch]:
    """Every workload field and row figure of ``actual`` that differs from ``golden`` (both the
    estimate's JSON, ``Estimate.as_dict()``)."""
    mismatches = [
        FigureMismatch("workload", key, golden.get(key), actual.get(key))
        for key in WORKLOAD_KEYS
        if golden.get(key) != actual.get(key)
    ]
    by_label = {row["label"]: row for row in golden["rows"]}
    for row in actual["rows"]:
        expected = by_label.get(row["label"])
        where = f"row {row['label']!r}"
        if expected is None:
            mismatches.append(FigureMismatch(where, "row", "absent", "measured"))
            continue
        mismatches += [
            FigureMismatch(where, key, expected.get(key), row.get(key))
            for key in (*ROW_KEYS, *(key for key in ROW_KEYS_SINCE if key in expected))
            if expected.get(key) != row.get(key)
        ]
        golden_kinds, kinds = expected.get("per_kind") or {}, row.get("per_kind") or {}
        for kind in sorted(set(golden_kinds) | set(kinds)):
            mismatches += [
                FigureMismatch(
                    where,
                    f"{kind} {key}",
                    (golden_kinds.get(kind) or {}).get(key),
                    (kinds.get(kind) or {}).get(key),
                )
                for key in PER_KIND_KEYS
                if (golden_kinds.get(kind) or {}).get(key) != (kinds.get(kind) or {}).get(key)
            ]
    return mismatches
