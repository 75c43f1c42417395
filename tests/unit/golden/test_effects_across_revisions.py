"""A seed study on another stack is judged on effects (issue 36, defect 4): the card's Moonlight golden
is pinned to the card's revisions, so a night on the installed stack was refused on the pin and the
headline comparison never ran. ``compare_effects`` judges each row against the matched ``[]`` control
of the night's own sweep, with both revision sets in the report; absolutes stay with exact pins."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.golden.judge import compare_effects, compare_records
from harness.golden.store import golden_root, goldens_of
from harness.record.io import load_records
from harness.record.metrics import EFFECT_METRICS, MetricName
from harness.record.model import Record, Revisions
from harness.report.markdown import comparison_markdown

SEED_RECORDS = (
    Path(__file__).resolve().parents[3] / "harness/data/reference/seed-moonlight-full-8gpu.json"
)


def _tonight() -> list[Record]:
    """The card's rows as if measured tonight on the installed stack: the same effects, other pins."""
    installed = Revisions.from_json(collect_revisions())
    return [replace(record, revisions=installed) for record in load_records([SEED_RECORDS])]


def _seed_golden():
    ((path, golden),) = goldens_of(
        "moonlight-full-8gpu", {"device": "H100_80GB", "gpu_count": 8}, golden_root()
    )
    return path, golden


def _with_peak(record: Record, peak: int) -> Record:
    data = record.to_json()
    data["metrics"]["headline"][MetricName.PEAK_ALLOCATED_BYTES] = peak
    return Record.from_json(data)


def test_the_card_golden_refuses_tonights_pins_but_judges_its_effects():
    path, golden = _seed_golden()
    records = _tonight()
    with pytest.raises(UsageError, match="refusing to compare"):
        compare_records(golden, records, str(path))
    comparison = compare_effects(golden, records, str(path))
    assert comparison.passed, [c.verdict for c in comparison.failures]
    assert {c.metric for c in comparison.checks} <= {*EFFECT_METRICS, "outcome", "row"}
    report = comparison_markdown(comparison)
    assert "effect-only: the golden is pinned to megatron-core 24bad8e677d2" in report
    assert (
        f"the records to megatron-core {collect_revisions()['megatron_core']['version']}" in report
    )


def test_a_label_that_stopped_saving_fails_by_its_effect():
    path, golden = _seed_golden()
    records = _tonight()
    control = next(r for r in records if r.recompute.is_control)
    peak = control.headline[MetricName.PEAK_ALLOCATED_BYTES]
    # moe_act's row now peaks where the control does: its 0.677 GB saving is gone.
    changed = [_with_peak(r, peak) if r.label == "moe_act" else r for r in records]
    comparison = compare_effects(golden, changed, str(path))
    failed = {(c.label, c.metric) for c in comparison.failures}
    assert ("moe_act", MetricName.SAVING_ALLOCATED_PCT) in failed
    assert all(label == "moe_act" for label, _ in failed)
