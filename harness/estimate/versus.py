"""The CPU estimate beside measured records of the same recipe: estimated vs measured saving per row.

Measured saving is the control's headline peak allocated minus the row's (both read at the same
checkpoint, as ``analyze`` compares them); estimated saving is the estimate's ``saving_bytes``
(retained activations at the end of forward). They measure different things: a peak can sit where
activations are not at their maximum, so the error column is the divergence worth watching, not a
tolerance. Rows without an estimate (requires-TE, rejected, unmeasured) show their status.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.compare.analysis import GB, Analysis
from harness.errors import UsageError

_ROW_KEYS = ("label", "status", "saving_bytes")


@dataclass
class VersusRow:
    label: str
    status: str  # the estimate's
    estimated_saving_bytes: int | None
    measured_saving_bytes: int | None
    error_pct: float | None  # (estimated - measured) / |measured|


def load_estimate(path: Path) -> dict[str, Any]:
    """An ``estimate --out`` file; any other content is a usage error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable estimate JSON file: {exc}") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("recipe"), str)
        or not isinstance(data.get("rows"), list)
        or not all(
            isinstance(row, dict) and all(key in row for key in _ROW_KEYS) for row in data["rows"]
        )
    ):
        raise UsageError(
            f"{path}: not an estimate (expected recipe and rows with {', '.join(_ROW_KEYS)})"
        )
    return data


def estimate_vs_measured(analysis: Analysis, estimate: dict[str, Any]) -> list[VersusRow]:
    if estimate["recipe"] != analysis.recipe:
        raise UsageError(
            f"the estimate is for recipe {estimate['recipe']!r}, the records for {analysis.recipe!r}"
        )
    control = next((row for row in analysis.rows if row.verdict == "control"), None)
    measured: dict[str, int | None] = {}
    for row in analysis.rows:
        if (
            control is not None
            and row.peak_allocated_gb is not None
            and control.peak_allocated_gb is not None
            and (row is control or row.allocated_vs_control_pct is not None)
        ):
            measured[row.label] = round((control.peak_allocated_gb - row.peak_allocated_gb) * GB)
        else:
            measured[row.label] = None
    out = []
    for row in estimate["rows"]:
        estimated = row["saving_bytes"]
        actual = measured.get(row["label"])
        error = None
        if estimated is not None and actual:
            error = (estimated - actual) / abs(actual) * 100
        out.append(VersusRow(row["label"], row["status"], estimated, actual, error))
    return out


def versus_json(rows: list[VersusRow]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]


def versus_markdown(rows: list[VersusRow], estimate: dict[str, Any]) -> str:
    def mb(value: int | None) -> str:
        return "–" if value is None else f"{value / 1e6:,.0f}"

    lines = [
        (
            f"### Estimate vs measured saving ({estimate['recipe']}, {estimate.get('attention_backend', '?')} "
            "core attention on CPU; estimate = retained activations at the end of forward, measured = "
            "peak allocated vs [])"
        ),
        "",
        "| recompute | estimate status | estimated saving (MB) | measured saving (MB) | error |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        error = "–" if row.error_pct is None else f"{row.error_pct:+.0f}%"
        lines.append(
            f"| {row.label} | {row.status} | {mb(row.estimated_saving_bytes)} | "
            f"{mb(row.measured_saving_bytes)} | {error} |"
        )
    return "\n".join(lines)
