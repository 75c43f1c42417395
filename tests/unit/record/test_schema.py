"""Run-record schema: strict loading, atomic writing, constructors, and one-line errors (exit 2)."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
from record_samples import run_json, run_record

from harness.cli import main
from harness.errors import UsageError
from harness.files import write_json_atomic
from harness.record.build import iteration_row, rank_peaks, run_metrics
from harness.record.io import load_records, write_record
from harness.record.model import validate_record
from harness.record.schema import SCHEMA_VERSION
from harness.record.vocabulary import PeakScope, RecordKind, RunStatus, StepPhase


def test_constructor_computes_headline_from_hottest_rank_after_iteration_2():
    rows = [iteration_row(i, step_time_ms=100.0 * i, loss=1.0) for i in range(1, 5)]
    ranks = [
        rank_peaks(0, {1: (10, 20), 2: (50, 60), 3: (70, 80), 4: (70, 80)}),
        rank_peaks(1, {1: (15, 25), 2: (55, 65), 3: (99, 99), 4: (99, 99)}),
    ]
    headline = run_metrics(rows, ranks, (3, 4)).headline
    assert (
        headline["peak_allocated_bytes"],
        headline.peak_rank,
        headline["peak_after_iteration"],
    ) == (55, 1, 2)
    assert headline["peak_reserved_bytes"] == 65
    assert headline["step_time_ms"] == pytest.approx(350.0)
    # the run's peak: the hottest rank after the last iteration every rank reported
    assert (headline["run_peak_allocated_bytes"], headline["run_peak_reserved_bytes"]) == (99, 99)


def test_a_run_peak_that_disagrees_with_the_ranks_is_refused(tmp_path):
    record = run_json(growth_after=4)
    record["metrics"]["headline"]["run_peak_allocated_bytes"] = record["metrics"]["headline"][
        "peak_allocated_bytes"
    ]
    (tmp_path / "r.json").write_text(json.dumps(record))
    with pytest.raises(
        UsageError,
        match="run_peak_allocated_bytes: 30000000000 is not what the per-rank peaks give",
    ):
        load_records([tmp_path])


def test_run_that_died_in_iteration_2_reports_the_last_common_iteration():
    ranks = [rank_peaks(0, {1: (10, 20)}), rank_peaks(1, {1: (30, 40), 2: (99, 99)})]
    assert run_metrics([iteration_row(1)], ranks, None).headline["peak_after_iteration"] == 1


def test_nan_loss_is_counted_and_never_written_as_nan(tmp_path):
    rows = [
        iteration_row(1, step_time_ms=1.0, loss=math.nan),
        iteration_row(2, step_time_ms=1.0, loss=math.inf),
    ]
    metrics = run_metrics(rows, [], (1, 2))
    assert metrics.nan_iterations == 2 and metrics.headline["step_time_ms"] is None
    assert all(row.loss is None for row in metrics.iterations)


def test_write_then_load_round_trips(tmp_path):
    record = run_record("moe_act")
    write_record(tmp_path / "r.json", record)
    assert load_records([tmp_path]) == [record]


def test_writer_refuses_invalid_record_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    write_record(path, run_record())
    before = path.read_bytes()
    broken = run_record()
    broken.headline.values["step_time_ms"] = math.nan
    with pytest.raises(UsageError, match="finite number"):
        write_record(path, broken)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


def test_atomic_writer_refuses_nan(tmp_path):
    with pytest.raises(UsageError, match="refusing to write"):
        write_json_atomic(tmp_path / "x.json", {"v": math.inf})
    assert not (tmp_path / "x.json").exists()


def _bad(tmp_path, text: str) -> str:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_records([path])
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


def test_loader_refuses_truncated_json(tmp_path):
    text = json.dumps(run_json())
    assert "truncated" in _bad(tmp_path, text[: len(text) // 2])


def test_loader_refuses_nan_literal(tmp_path):
    text = json.dumps(run_json()).replace('"loss": 2.0', '"loss": NaN', 1)
    assert "NaN" in _bad(tmp_path, text)


def test_loader_refuses_unknown_schema_version(tmp_path):
    record = run_json()
    record["schema_version"] = SCHEMA_VERSION + 1
    assert "unknown schema version" in _bad(tmp_path, json.dumps(record))


def test_loader_refuses_missing_pins(tmp_path):
    record = run_json()
    record["revisions"]["megatron_core"]["fingerprint"] = None
    assert "revisions.megatron_core.fingerprint" in _bad(tmp_path, json.dumps(record))
    del record["revisions"]["megatron_core"]
    assert "missing megatron_core" in _bad(tmp_path, json.dumps(record))


def test_loader_refuses_duplicated_keys_and_iteration_rows(tmp_path):
    assert "duplicated key" in _bad(tmp_path, '{"schema": 1, "schema": 2}')
    record = run_json()
    record["metrics"]["iterations"].append(copy.deepcopy(record["metrics"]["iterations"][0]))
    assert "duplicated row for iteration 1" in _bad(tmp_path, json.dumps(record))


def test_loader_refuses_duplicated_rows_across_files(tmp_path):
    first, second = run_json("moe_act", record_id="a"), run_json("moe_act", record_id="b")
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    with pytest.raises(UsageError, match="duplicated row"):
        load_records([tmp_path])
    (tmp_path / "b.json").write_text(json.dumps([run_json("core_attn", record_id="a")]))
    with pytest.raises(UsageError, match="duplicated record id"):
        load_records([tmp_path])


def test_loader_refuses_mixed_schema_versions(tmp_path):
    newer = run_json("core_attn")
    newer["schema_version"] = 2
    (tmp_path / "a.json").write_text(json.dumps(run_json()))
    (tmp_path / "b.json").write_text(json.dumps(newer))
    with pytest.raises(UsageError, match="mixed schema versions"):
        load_records([tmp_path])


def test_validator_names_the_path_of_the_problem():
    record = run_json()
    record["outcome"]["phase"] = "lunch"
    with pytest.raises(UsageError, match=r"outcome\.phase: 'lunch' is not one of"):
        validate_record(record)


@pytest.mark.parametrize(
    "command", ["analyze", "compare --golden tests/golden/none.json", "select --target-gb 1"]
)
def test_cli_bad_record_is_one_line_exit_2(tmp_path, capsys, command):
    path = tmp_path / "r.json"
    path.write_text('{"schema": "recompute-harness/run-record", "schema_version": 1, ')
    code = main([*command.split(), str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("recompute-harness: error:") and err.count("\n") == 1


def test_created_must_be_iso_8601():
    record = run_json()
    record["created"] = "yesterday"
    with pytest.raises(UsageError, match="ISO-8601"):
        validate_record(record)


def _documented_values(key: str) -> list[str]:
    """The alternatives docs/run-record.md's record example gives for ``"key":`` (continuation lines
    that start with ``|`` included), in order, without ``null``."""
    lines = (Path(__file__).parents[3] / "docs" / "run-record.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if f'"{key}": "' in line)
    text = lines[start].split(f'"{key}":', 1)[1]
    for line in lines[start + 1 :]:
        if not line.strip().startswith("|"):
            break
        text += line
    return re.findall(r'"([^"]+)"', text.split("//")[0].split("],")[0].split("},")[0])


@pytest.mark.parametrize(
    ("key", "enum"),
    [("kind", RecordKind), ("status", RunStatus), ("phase", StepPhase), ("peak_scope", PeakScope)],
)
def test_the_documented_closed_sets_are_the_declared_ones_in_order(key, enum):
    assert _documented_values(key) == [member.value for member in enum]
