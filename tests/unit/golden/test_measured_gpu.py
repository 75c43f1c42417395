"""The GPU measurements landed from a lent H200 (tests/measured/, docs/measured-gpu.md) stay loadable,
and the committed golden is exactly what ``golden refresh`` writes from them (only the refresh's own
invocation differs: command line, date, host): a golden edited by hand, or records edited after the fact, fail here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.record.io import load_records

ROOT = Path(__file__).resolve().parents[3]
MEASURED = sorted((ROOT / "tests" / "measured").glob("gpu-check-*"))


@pytest.mark.parametrize("measured", MEASURED, ids=[path.name for path in MEASURED])
def test_measured_records_load_and_reproduce_their_golden(measured, tmp_path, capsys):
    records = load_records([measured / "records"])
    assert records and all(record.outcome.status == "completed" for record in records)
    assert all(record.hardware.device not in ("cpu", "unidentified") for record in records)
    assert (
        main(["golden", "refresh", "--golden-dir", str(tmp_path), str(measured / "records")]) == 0
    )
    capsys.readouterr()
    (written,) = tmp_path.glob("*.json")
    committed_path = ROOT / "tests" / "golden" / written.name
    assert committed_path.is_file(), f"no committed golden {written.name} for {measured.name}"
    fresh, committed = json.loads(written.read_text()), json.loads(committed_path.read_text())
    for written_now in ("command", "date", "host"):  # the refresh's own invocation, not the data
        fresh["provenance"].pop(written_now), committed["provenance"].pop(written_now)
    assert fresh == committed


def test_measured_sets_are_listed_in_their_doc():
    doc = (ROOT / "docs" / "measured-gpu.md").read_text()
    assert MEASURED and all(f"tests/measured/{path.name}" in doc for path in MEASURED)
