"""A full disk, for real (a small tmpfs of the test's own): a write that cannot complete is one line and
exit 2, the golden already there is untouched, and no temporary file or empty sweep is left behind."""

from __future__ import annotations

import shlex
import sys

import pytest
from record_samples import run_record, write_records
from small_disk import run_on_small_disk

HARNESS = f"{shlex.quote(sys.executable)} -m harness.cli"


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_refresh_onto_a_full_disk_keeps_the_old_golden_whole(tmp_path):
    first = write_records(tmp_path / "first", run_record(), run_record("moe_act"))
    second = write_records(tmp_path / "second", run_record(step_ms=440.0), run_record("moe_act"))
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir(), out.mkdir()
    result = run_on_small_disk(
        disk,
        f"""
{HARNESS} golden refresh --golden-dir "$DISK/golden" {shlex.join(first)} > /dev/null || exit 10
sha256sum "$DISK"/golden/*.json > {out}/before
fill_disk
{HARNESS} golden refresh --golden-dir "$DISK/golden" {shlex.join(second)} > {out}/stdout 2> {out}/stderr
echo $? > {out}/rc
sha256sum "$DISK"/golden/*.json > {out}/after
ls -A "$DISK/golden" > {out}/listing
""",
    )
    assert result.returncode == 0, result
    assert (out / "rc").read_text().strip() == "2"
    line = _one_error_line((out / "stderr").read_text())
    assert "cannot write" in line and "No space left on device" in line, line
    assert (out / "after").read_text() == (
        out / "before"
    ).read_text()  # the old golden, byte for byte
    assert len((out / "listing").read_text().split()) == 1  # and no temporary file beside it


@pytest.mark.slow
def test_a_sweep_onto_a_full_disk_launches_nothing_and_leaves_no_empty_sweep(tmp_path):
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir(), out.mkdir()
    result = run_on_small_disk(
        disk,
        f"""
mkdir "$DISK/sweeps"
fill_disk
{HARNESS} run --recipe cpu-moonlight-ep2 --rows mla_up_proj --out "$DISK/sweeps" > /dev/null 2> {out}/stderr
echo $? > {out}/rc
ls -A "$DISK/sweeps" > {out}/listing
""",
    )
    assert result.returncode == 0, result
    assert (out / "rc").read_text().strip() == "2"
    line = _one_error_line((out / "stderr").read_text())
    assert "SWEEP.json: cannot write" in line and "No space left on device" in line, line
    assert (out / "listing").read_text() == ""
