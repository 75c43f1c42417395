"""The typed record and golden: every schema-v1 file on disk loads and re-serialises unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from record_samples import run_record

from harness.golden.seed import RECORDS_DIR
from harness.golden.store import CHECKOUT_ROOT, load_golden
from harness.record.io import load_records, read_json
from harness.record.model import Record

V1_RECORD_FILES = sorted(RECORDS_DIR.glob("seed-*.json"))
V1_GOLDENS = sorted(CHECKOUT_ROOT.rglob("*.json"))


def _text(data) -> str:
    return json.dumps(data, indent=2)  # key order included: the written files keep their layout


@pytest.mark.parametrize("path", V1_RECORD_FILES, ids=lambda p: p.name)
def test_committed_v1_records_round_trip_byte_for_byte(path: Path):
    original = read_json(path)
    assert [r.to_json() for r in load_records([path])] == original
    assert _text([r.to_json() for r in load_records([path])]) == _text(original)


@pytest.mark.parametrize(
    "path",
    [p for p in V1_GOLDENS if not {"labels", "estimate", "capacity"} & set(p.parts)],
    ids=lambda p: p.name,
)
def test_committed_v1_goldens_round_trip_byte_for_byte(path: Path):
    assert path.read_text(encoding="utf-8") == _text(load_golden(path).to_json()) + "\n"


def test_a_built_record_is_typed_and_its_json_validates():
    record = run_record("moe_act", gpus=3)
    assert record.label == "moe_act" and record.recompute.modules == ("moe_act",)
    assert [rank.rank for rank in record.run_metrics.ranks] == [0, 1, 2]
    again = Record.from_json(json.loads(json.dumps(record.to_json())), "copy")
    assert again == record
