"""``estimate --check-golden``: a fresh estimate judged against the committed one, row by row.

The estimate's bytes are exact on CPU (real layers, deterministic shapes, rational extrapolation), so
every judged figure must match the golden to the byte: a row whose saving, retained bytes or status
changed is a regression of what that label does at the recipe's real shapes, and is named.

The golden's rows are what is judged: without ``--rows`` the check measures exactly the golden's rows;
with ``--rows`` every row named must be in the golden (a row the golden lacks has nothing to be judged
against, so it is refused before anything is measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.record.io import read_json

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
ROW_KEYS = ("status", "retained_bytes", "saving_bytes", "partial_saving_bytes")
# Judged only where the golden has them: goldens written before the peaks were measured stay usable.
ROW_KEYS_SINCE = ("peak_bytes", "peak_saving_bytes", "peak_phase")
PER_KIND_KEYS = ("layers", "retained_bytes", "saving_bytes")


@dataclass(frozen=True)
class EstimateMismatch:
    """One figure that differs from the golden: ``where`` is ``workload`` or ``row '<label>'``."""

    where: str
    figure: str
    golden: Any
    actual: Any

    def line(self) -> str:
        delta = ""
        if isinstance(self.golden, int) and isinstance(self.actual, int) and self.golden:
            delta = f" ({(self.actual - self.golden) / abs(self.golden) * 100:+.2f} %)"
        return f"{self.where}: {self.figure} golden {self.golden!r}, now {self.actual!r}{delta}"


def load_estimate_golden(path: Path) -> dict[str, Any]:
    """The golden estimate at ``path``; a missing or malformed file is bad input (exit 2)."""
    if not path.is_file():
        raise UsageError(
            f"no estimate golden {path} (write one with estimate --recipe ... --write-golden)"
        )
    data = read_json(path)
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(
        isinstance(row, dict) and isinstance(row.get("label"), str) for row in rows
    ):
        raise UsageError(f"{path}: not an estimate golden (no rows with labels)")
    return data


def golden_rows(golden: dict[str, Any], requested: list[str] | None, where: Path) -> list[str]:
    """The rows to measure: the golden's, or ``requested`` when each of them is in the golden."""
    labels = [row["label"] for row in golden["rows"]]
    if requested is None:
        return labels
    missing = [row for row in requested if RecomputeFields.parse(row).name not in labels]
    if missing:
        raise UsageError(
            f"{where} has no row {', '.join(map(repr, missing))} to judge "
            f"(its rows: {', '.join(labels)})"
        )
    return list(requested)


def judge_estimate(golden: dict[str, Any], actual: dict[str, Any]) -> list[EstimateMismatch]:
    """Every workload field and row figure of ``actual`` that differs from ``golden``."""
    mismatches = [
        EstimateMismatch("workload", key, golden.get(key), actual.get(key))
        for key in WORKLOAD_KEYS
        if golden.get(key) != actual.get(key)
    ]
    by_label = {row["label"]: row for row in golden["rows"]}
    for row in actual["rows"]:
        expected = by_label.get(row["label"])
        where = f"row {row['label']!r}"
        if expected is None:
            mismatches.append(EstimateMismatch(where, "row", "absent", "measured"))
            continue
        mismatches += [
            EstimateMismatch(where, key, expected.get(key), row.get(key))
            for key in (*ROW_KEYS, *(key for key in ROW_KEYS_SINCE if key in expected))
            if expected.get(key) != row.get(key)
        ]
        golden_kinds, kinds = expected.get("per_kind") or {}, row.get("per_kind") or {}
        for kind in sorted(set(golden_kinds) | set(kinds)):
            mismatches += [
                EstimateMismatch(
                    where,
                    f"{kind} {key}",
                    (golden_kinds.get(kind) or {}).get(key),
                    (kinds.get(kind) or {}).get(key),
                )
                for key in PER_KIND_KEYS
                if (golden_kinds.get(kind) or {}).get(key) != (kinds.get(kind) or {}).get(key)
            ]
    return mismatches
