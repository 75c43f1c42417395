"""Automatic boundary selection: the cheapest recompute row that completes under a memory target.

The skill lists this as missing: "the correct result is the smallest measured replay cost that
satisfies the per-rank memory target, not the longest module list". A row qualifies only if it
completed through optimizer-state initialisation and its steady window (a failure never qualifies,
however far it got) with its allocated peak at or under the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.compare.analysis import GB, completed, require_matched
from harness.record.metrics import MetricName
from harness.record.model import Record


@dataclass(frozen=True)
class Selection:
    target_gb: float
    chosen: str | None
    peak_allocated_gb: float | None
    step_time_ms: float | None
    considered: list[tuple[str, str]]  # (label, why it was or was not chosen)


def select(records: Sequence[Record], target_gb: float) -> Selection:
    """Least step time among completed rows under ``target_gb``; ties go to the narrower boundary."""
    require_matched(records)
    fitting, considered = [], []
    for record in records:
        label = record.label
        peak = record.headline[MetricName.PEAK_ALLOCATED_BYTES]
        if not completed(record):
            considered.append((label, f"did not complete ({record.outcome.status})"))
        elif peak is None:
            considered.append((label, "no allocated peak recorded"))
        elif peak / GB > target_gb:
            considered.append((label, f"peak {peak / GB:.3f} GB over the {target_gb:g} GB target"))
        else:
            fitting.append(record)
    fitting.sort(
        key=lambda r: (
            r.headline[MetricName.STEP_TIME_MS],
            r.recompute.width,
            r.headline[MetricName.PEAK_ALLOCATED_BYTES],
        )
    )
    for record in fitting[1:]:
        considered.append(
            (record.label, f"fits, but slower ({record.headline[MetricName.STEP_TIME_MS]:.2f} ms)")
        )
    if not fitting:
        return Selection(target_gb, None, None, None, considered)
    best = fitting[0]
    headline = best.headline
    best_peak = headline[MetricName.PEAK_ALLOCATED_BYTES]
    assert best_peak is not None  # a record without one was considered, not fitting, above
    return Selection(
        target_gb,
        best.label,
        best_peak / GB,
        headline[MetricName.STEP_TIME_MS],
        considered,
    )
