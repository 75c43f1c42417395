"""Reports: markdown to the terminal and $GITHUB_STEP_SUMMARY, JSON, and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import main
from harness.golden.seed import RECORDS_DIR

MOONLIGHT = str(RECORDS_DIR / "seed-moonlight-full-8gpu.json")
NEMOTRON = str(RECORDS_DIR / "seed-nemotron-3-nano-full-16gpu.json")


def test_markdown_goes_to_terminal_and_step_summary(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["analyze", MOONLIGHT]) == 0
    out = capsys.readouterr().out
    assert "| moe_act | pass #1 |" in out
    text = summary.read_text()
    assert text.startswith("earlier step\n") and out.strip() in text


def test_json_report_is_strict_json(capsys):
    assert main(["analyze", NEMOTRON, "--json"]) == 0
    data = json.loads(
        capsys.readouterr().out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))
    )
    verdicts = {row["label"]: row["verdict"] for row in data["rows"]}
    assert verdicts["moe_act"] == "advanced-but-failed" and verdicts["[]"] == "control"
    assert main(["select", "--target-gb", "36", MOONLIGHT, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chosen"] == "moe_act"


def test_plot_is_a_png_and_names_rows_left_out(tmp_path, capsys):
    png = tmp_path / "plots" / "nemotron.png"
    assert main(["analyze", NEMOTRON, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert [p.name for p in png.parent.iterdir()] == ["nemotron.png"]


def test_the_plot_footnote_names_what_the_table_leaves_unranked():
    from harness.compare.analysis import analyse
    from harness.record.io import load_records
    from harness.report.plot import plot_analysis

    analysis = analyse(load_records([NEMOTRON]))
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        left_out = plot_analysis(analysis, Path(directory) / "p.png")
    notes = {row.label: row.note or row.stage for row in analysis.rows}
    assert left_out and all(
        f"{label} ({notes[label]})" in left_out for label in ("moe", "core_attn")
    )


def test_nothing_to_plot_is_one_line_and_no_file(tmp_path, capsys):
    png = tmp_path / "only-control.png"
    control = json.loads(Path(MOONLIGHT).read_text())[:1]
    (tmp_path / "control.json").write_text(json.dumps(control))
    assert main(["analyze", str(tmp_path / "control.json"), "--plot", str(png)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not plotted: only the [] control" in err and not png.exists()


def test_golden_check_properties_land_in_junit_xml(tmp_path):
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    from harness.golden.store import CHECKOUT_ROOT as GOLDEN_DIR

    test_file = tmp_path / "test_seed_golden.py"
    test_file.write_text(
        "from harness.testing import check_against_golden\n"
        "from harness.record.io import load_records\n"
        f"def test_seed(record_property):\n"
        f"    check_against_golden(load_records([{MOONLIGHT!r}]), {str(GOLDEN_DIR)!r}, record_property)\n"
    )
    junit = tmp_path / "junit.xml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "no:hypothesispytest",
            f"--junitxml={junit}",
            "--rootdir",
            str(tmp_path),
            str(test_file),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert properties["golden.moe_act.step_time_cost_pct"].startswith(
        "pass: golden=+1.99% actual=+1.99%"
    )
