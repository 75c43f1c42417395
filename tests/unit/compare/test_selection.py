"""Selection: the cheapest completed row under a memory target; a failure never qualifies."""

from __future__ import annotations

from record_samples import run_record

from harness.compare.analysis import analyse
from harness.compare.selection import select


def _rows(analysis):
    return {row.label: row for row in analysis.rows}


def test_failure_where_the_control_completed_is_failed_and_never_selected():
    rows = _rows(analyse([run_record(), run_record("moe_act", peak=10**6, status="oom")]))
    assert rows["moe_act"].verdict == "failed" and rows["moe_act"].rank is None
    assert (
        select([run_record(), run_record("moe_act", peak=10**6, status="oom")], 29.0).chosen is None
    )


def test_selection_ties_go_to_the_narrower_boundary():
    records = [
        run_record(peak=40_000_000_000),
        run_record("moe_act", "layernorm", peak=20_000_000_000),
        run_record("moe_act", peak=20_000_000_000),
    ]
    assert select(records, 30.0).chosen == "moe_act"
