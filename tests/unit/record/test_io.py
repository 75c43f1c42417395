"""Record loading from directories: a sweep's own bookkeeping JSON is never taken for a record."""

from __future__ import annotations

from harness.record.io import load_records, write_record
from record_samples import run_record


def test_a_sweep_directory_yields_its_records_not_its_row_specs(tmp_path):
    write_record(tmp_path / "sweep" / "records" / "control.json", run_record())
    (tmp_path / "sweep" / "rows" / "control").mkdir(parents=True)
    (tmp_path / "sweep" / "rows" / "control" / "spec.json").write_text('{"row": "[]"}')
    (tmp_path / "sweep" / "INTERRUPTED.json").write_text('{"row": "[]"}')
    assert len(load_records([tmp_path])) == 1
    assert len(load_records([tmp_path / "sweep"])) == 1
