"""The probe's verdict block: short, the first difference named, each unmeasured reason once; the
tables in a report file whose path it prints (harness.report.summary, harness.report.probe_summary)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.golden.probe import golden_step
from harness.golden.store import golden_filename
from harness.probe.runner import probe_models
from harness.report.probe_summary import probe_summary
from harness.report.summary import REPORT_HEADER, print_summary

# The main job's last screen.
SCREEN_LINES = 25


@pytest.fixture(scope="module")
def dense_probe():
    # Two effective labels and the control: the rows a golden judges; a few seconds.
    (probe,) = probe_models(["dense-tiny"], [("core_attn",), ("layernorm",)], hang_probe=False)
    return probe


def _block(probe, step, *, checking):
    summary = probe_summary(
        [probe], command="probe", wall_s=1.0, golden=step, checking=checking, report="r.md"
    )
    out = io.StringIO()
    print_summary(summary, out)
    return summary, out.getvalue().strip().splitlines()


def test_a_matching_probe_passes_in_one_short_block(dense_probe, tmp_path):
    golden_step([dense_probe], write=True, golden_dir=tmp_path)
    summary, lines = _block(
        dense_probe, golden_step([dense_probe], write=False, golden_dir=tmp_path), checking=True
    )
    assert summary.passed
    assert len(lines) <= SCREEN_LINES
    assert lines[0].startswith("== probe: megatron-core ")
    assert lines[-1].startswith("PASS: recompute behaviour matches its goldens (1/1)")
    assert "\x1b[" not in "".join(lines)  # not a terminal: no colour codes


def test_a_differing_golden_is_named_with_its_row_and_the_refresh_command(dense_probe, tmp_path):
    (written,) = golden_step([dense_probe], write=True, golden_dir=tmp_path).written
    path = Path(written)
    golden = json.loads(path.read_text())
    row = next(row for row in golden["rows"] if row["label"] == "layernorm")
    row["values"]["retained_bytes"] += 4096  # the label now saves 4 KiB less than it did
    path.write_text(json.dumps(golden))
    step = golden_step([dense_probe], write=False, golden_dir=tmp_path)
    summary, lines = _block(dense_probe, step, checking=True)
    assert not summary.passed and step.differs
    assert lines[-1].startswith("FAIL: 1 of 1 golden(s) differ; first: dense-tiny: layernorm: ")
    assert "retained_bytes" in lines[-1]
    assert any(line.strip().startswith("refresh if intended: ./venv-run") for line in lines)
    assert len(lines) <= SCREEN_LINES


def test_each_unmeasured_reason_is_said_once(dense_probe):
    _, lines = _block(dense_probe, None, checking=False)
    # dense-tiny's plan here has no moe_act row: what it measured decides; every line unique.
    assert len(lines) == len(set(lines))
    assert lines[-1].startswith("PASS: 1 pass(es) probed; no golden judged")


def test_the_probe_command_prints_the_block_and_writes_the_tables_to_a_report(tmp_path, capsys):
    report = tmp_path / "tables.md"
    argv = ["probe", "--model", "dense-tiny", "--modules", "core_attn", "--precision", "fp32"]
    assert main([*argv, "--jobs", "1", "--report", str(report)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) <= SCREEN_LINES and lines[-1].startswith("PASS: ")
    assert f"report     {report} (every table; --details prints them)" in lines
    text = report.read_text()
    assert text.startswith(REPORT_HEADER) and "| `core_attn` |" in text


def test_a_report_path_that_is_not_a_report_is_refused_before_any_work(tmp_path, capsys):
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    argv = ["probe", "--model", "dense-tiny", "--report", str(notes)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to overwrite it" in err
    assert notes.read_text() == "my notes\n"


def _as_another_fingerprints(probe, tmp_path, retained_added: dict[str, int]) -> str:
    """Write ``probe``'s golden as another fingerprint of its version wrote it (what an edited tree
    of the same version finds), ``retained_added`` bytes more retained per label; its version."""
    (written,) = golden_step([probe], write=True, golden_dir=tmp_path).written
    path = Path(written)
    golden = json.loads(path.read_text())
    golden["pins"]["megatron_core"]["fingerprint"] = "0123456789abcdef"
    for row in golden["rows"]:
        row["values"]["retained_bytes"] += retained_added.get(row["label"], 0)
    other = path.with_name(golden_filename(golden["recipe"], golden["hardware"], golden["pins"]))
    other.write_text(json.dumps(golden))
    path.unlink()
    return golden["pins"]["megatron_core"]["version"]


def test_a_tree_without_goldens_of_its_own_names_the_changed_value_not_the_missing_file(
    dense_probe, tmp_path
):
    # As an edited tree of the same version sees it: the only golden is another fingerprint's, and
    # by it the layernorm row now saves 4 KiB more than it did.
    version = _as_another_fingerprints(dense_probe, tmp_path, {"layernorm": 4096})
    step = golden_step([dense_probe], write=False, golden_dir=tmp_path)
    summary, lines = _block(dense_probe, step, checking=True)
    text = "\n".join(lines)
    assert not summary.passed and "no CPU golden" not in text
    said = f"judged against the golden(s) of another fingerprint of {version} (01234567…)"
    assert text.count(said) == 1 and text.count("another fingerprint") == 1
    first = next(line.strip() for line in lines if line.strip().startswith("first: "))
    assert first.startswith("first: dense-tiny: layernorm: retained_bytes ")
    assert lines[-1].startswith("FAIL: 1 of 1 golden(s) differ; first: dense-tiny: layernorm: ")
    changed = next(line for line in lines if line.startswith("changed "))
    assert changed.split(maxsplit=1)[1].startswith(
        "layernorm: saves more on dense-tiny (retained -"
    )
    assert len(lines) <= SCREEN_LINES


def test_a_tree_without_goldens_of_its_own_and_no_value_changed_passes_as_same_behaviour(
    dense_probe, tmp_path
):
    version = _as_another_fingerprints(dense_probe, tmp_path, {})
    summary, lines = _block(
        dense_probe, golden_step([dense_probe], write=False, golden_dir=tmp_path), checking=True
    )
    assert summary.passed
    assert lines[-1].startswith(
        f"PASS: same behaviour as the goldens of another fingerprint of {version} (01234567…): "
        "no value changed (1/1)"
    )
