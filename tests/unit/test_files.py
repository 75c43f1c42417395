"""harness.files: atomic writes that keep symlinks, sweep a killed writer's temp files, refuse to
overwrite what they did not write, and bounded reads of regular files only."""

from __future__ import annotations

import os

import pytest

from harness.errors import UsageError
from harness.files import check_output, read_bounded_text, write_text_atomic


def test_a_symlinked_target_stays_a_symlink(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_killed_writers_temp_file_is_swept_on_the_next_write(tmp_path):
    stale = tmp_path / ".g.json.abc123.tmp"  # what a SIGKILLed refresh leaves: 0 bytes
    stale.write_text("")
    write_text_atomic(tmp_path / "g.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


def test_write_failures_are_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        write_text_atomic(tmp_path / "file" / "g.json", "{}")
    with pytest.raises(UsageError, match="is a directory"):
        write_text_atomic(tmp_path, "{}")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(UsageError, match="not writable"):
            write_text_atomic(locked / "g.json", "{}")


def test_check_output_refuses_what_the_command_did_not_write(tmp_path):
    record = tmp_path / "record.json"
    record.write_text('{"schema": "recompute-harness/run-record"}')
    own = lambda head: head.startswith(b"\x89PNG")
    with pytest.raises(UsageError, match="refusing to overwrite"):
        check_output(record, False, own, "PNG plot")
    check_output(record, True, own, "PNG plot")  # --force
    with pytest.raises(UsageError, match="is a directory"):
        check_output(tmp_path, True, own, "PNG plot")
    (tmp_path / "old.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    check_output(tmp_path / "old.png", False, own, "PNG plot")  # its own previous output
    check_output(tmp_path / "new.png", False, own, "PNG plot")


def test_reads_are_bounded_regular_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):  # would block forever
        read_bounded_text(fifo)
    with pytest.raises(UsageError, match="not a regular file"):  # would grow without end
        read_bounded_text("/dev/zero")
    big = tmp_path / "big.json"
    big.write_text("x" * 2048)
    with pytest.raises(UsageError, match="input limit"):
        read_bounded_text(big, limit=1024)
    assert read_bounded_text(big) == "x" * 2048
