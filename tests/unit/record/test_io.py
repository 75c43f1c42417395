"""Record loading from directories: a sweep's own bookkeeping JSON is never taken for a record, and a
sweep whose plan names rows without a record is known as incomplete."""

from __future__ import annotations

import pytest
from record_samples import run_record, write_sweep

from harness.errors import UsageError
from harness.record.io import SWEEP_PLAN, load_records, unmeasured_rows, write_record


def test_a_sweep_directory_yields_its_records_not_its_row_specs(tmp_path):
    write_record(tmp_path / "sweep" / "records" / "control.json", run_record())
    (tmp_path / "sweep" / "rows" / "control").mkdir(parents=True)
    (tmp_path / "sweep" / "rows" / "control" / "spec.json").write_text('{"row": "[]"}')
    (tmp_path / "sweep" / "INTERRUPTED.json").write_text('{"row": "[]"}')
    assert len(load_records([tmp_path])) == 1
    assert len(load_records([tmp_path / "sweep"])) == 1


def test_a_sweep_whose_plan_has_rows_without_records_is_named_incomplete(tmp_path):
    sweep = write_sweep(
        tmp_path / "out" / "sweep",
        {"[]": run_record(), "moe_act": run_record("moe_act"), "layernorm": None, "mlp": None},
    )
    assert len(load_records([sweep])) == 2  # the plan is bookkeeping, not a record
    for named in (sweep, sweep / "records", tmp_path / "out"):
        (line,) = unmeasured_rows([named])
        assert line.startswith(
            f"{sweep}: incomplete sweep: no record for row(s) layernorm, mlp of the 4 planned"
        )
    assert (
        unmeasured_rows(sorted((sweep / "records").glob("*.json"))) == []
    )  # files named one by one: a choice
    complete = write_sweep(
        tmp_path / "complete", {"[]": run_record(), "moe_act": run_record("moe_act")}
    )
    assert unmeasured_rows([complete, complete / "records"]) == []


def test_a_sweep_stopped_before_its_first_record_says_so(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", {"[]": None, "moe_act": None})
    with pytest.raises(
        UsageError, match=r"incomplete sweep: no record for row\(s\) \[\], moe_act of the 2 planned"
    ):
        load_records([sweep])


@pytest.mark.parametrize(
    "plan", ['{"schema": "recompute-harness/sweep-plan", "rows": [{"row": "[]"}]}', "[1, 2]", "{"]
)
def test_a_malformed_plan_is_one_line(tmp_path, plan):
    sweep = write_sweep(tmp_path / "sweep", {"[]": run_record()})
    (sweep / SWEEP_PLAN).write_text(plan)
    with pytest.raises(UsageError, match=str(sweep / SWEEP_PLAN)):
        unmeasured_rows([sweep])
