"""The pytest plugin as another repo meets it: a foreign project in tmp_path, its own --strict-markers,
records judged against goldens written by --recompute-regen, JUnit properties per metric."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from record_samples import REVISIONS, run_record, write_records

FOREIGN_TEST = """
import json
import os
import pytest

@pytest.mark.gpu
@pytest.mark.slow
def test_records_match_their_golden(recompute_golden):
    recompute_golden.check(os.environ["RECORDS"].split(","))

def test_parsed_records_match_their_golden(recompute_golden):
    parsed = []
    for path in os.environ["RECORDS"].split(","):
        with open(path) as file:
            parsed.append(json.load(file))
    recompute_golden.check(parsed)
"""


def _pytest(project, records, *flags):
    junit = project / "junit.xml"
    env = {"PATH": "/usr/bin:/bin", "RECORDS": ",".join(records)}
    result = subprocess.run(
        # The foreign project knows nothing of the harness: the plugin comes from the pytest11 entry point
        # of the installed harness (or -p, as in this repo's addopts, for a PYTHONPATH install).
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "harness.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "no:hypothesispytest",
            "--rootdir",
            str(project),
            f"--junitxml={junit}",
            *flags,
        ],
        cwd=project,
        env=env | {"PYTHONPATH": ":".join(sys.path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, junit


@pytest.mark.slow
def test_a_foreign_project_regenerates_then_judges_with_the_plugin(tmp_path):
    project = tmp_path / "bridge"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = "--strict-markers"\n'
    )
    (project / "test_recompute.py").write_text(FOREIGN_TEST)
    golden = tmp_path / "goldens"
    good = write_records(tmp_path / "good", run_record(), run_record("core_attn"))

    regen, _ = _pytest(project, good, "--recompute-golden-dir", str(golden), "--recompute-regen")
    assert regen.returncode == 1, regen.stdout + regen.stderr
    assert "--recompute-regen: wrote " + str(golden) in regen.stdout
    assert len(list(golden.glob("tiny-recipe__*.json"))) == 1

    judged, junit = _pytest(project, good, "--recompute-golden-dir", str(golden))
    assert judged.returncode == 0, judged.stdout + judged.stderr
    assert "2 passed" in judged.stdout and "warning" not in judged.stdout, judged.stdout
    # The default junit_family (xunit2): each test's properties, without pytest's record_property warning.
    cases = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}
    for name in ("test_records_match_their_golden", "test_parsed_records_match_their_golden"):
        properties = {p.get("name"): p.get("value") for p in cases[name].iter("property")}
        assert properties["golden.[].step_time_ms"].startswith("pass: golden=400.00 actual=400.00")

    slower = write_records(tmp_path / "slow", run_record(step_ms=500.0), run_record("core_attn"))
    failed, _ = _pytest(project, slower, "--recompute-golden-dir", str(golden))
    assert failed.returncode == 1 and "2 failed" in failed.stdout, failed.stdout
    assert "FAIL: regressed" in failed.stdout


@pytest.mark.slow
def test_records_of_other_pins_fail_naming_the_missing_golden(tmp_path):
    project = tmp_path / "mcore"
    project.mkdir()
    (project / "test_recompute.py").write_text(FOREIGN_TEST)
    bumped = run_record(revisions=REVISIONS | {"torch": "2.15.0"})
    golden = tmp_path / "goldens"
    regen, _ = _pytest(
        project,
        write_records(tmp_path / "old", run_record()),
        "--recompute-golden-dir",
        str(golden),
        "--recompute-regen",
    )
    assert regen.returncode == 1 and f"--recompute-regen: wrote {golden}" in regen.stdout
    judged, _ = _pytest(
        project, write_records(tmp_path / "new", bumped), "--recompute-golden-dir", str(golden)
    )
    assert (
        judged.returncode == 1
        and "no golden" in judged.stdout
        and "for these revision pins" in judged.stdout
    )
