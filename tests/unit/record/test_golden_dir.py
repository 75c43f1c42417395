"""The golden root: one place names it (option, environment, checkout) and finds a records' golden."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.errors import UsageError
from harness.record.golden_dir import CHECKOUT_ROOT, ENV_VAR, golden_path_for, golden_root, newest_like
from harness.record.io import write_record
from record_samples import REVISIONS, run_record, write_records


def test_option_then_environment_then_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert golden_root() == CHECKOUT_ROOT
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert golden_root() == tmp_path / "env"
    assert golden_root(tmp_path / "option") == tmp_path / "option"
    with pytest.raises(UsageError, match="--golden-dir is empty"):
        golden_root("")
    monkeypatch.setenv(ENV_VAR, "")
    with pytest.raises(UsageError, match=f"{ENV_VAR} is empty"):
        golden_root()


def test_refresh_and_compare_find_the_golden_through_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "goldens"))
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    records = [run_record(), run_record("moe_act", peak=29_000_000_000)]
    paths = write_records(tmp_path, *records)
    assert main(["golden", "refresh", *paths]) == 0
    (written,) = (tmp_path / "goldens").glob("*.json")
    assert written == golden_path_for(records, tmp_path / "goldens")
    assert not (tmp_path / "tests").exists()
    assert main(["compare", *paths]) == 0  # no --golden: the root's golden for these pins
    assert main(["compare", "--golden", str(tmp_path / "goldens"), *paths]) == 0  # a directory
    capsys.readouterr()
    bumped = {**REVISIONS, "torch": "2.15.0"}
    write_record(tmp_path / "new.json", run_record(revisions=bumped))
    assert main(["compare", str(tmp_path / "new.json")]) == 2
    assert "no golden" in capsys.readouterr().err


def test_newest_like_prefers_the_same_file_then_the_newest_other_revision(tmp_path):
    root = tmp_path / "goldens"
    assert main(["golden", "refresh", "--golden-dir", str(root), *write_records(tmp_path, run_record())]) == 0
    (first,) = root.glob("*.json")
    assert newest_like(first)[0] == first
    other = root / first.name.replace("mcore-", "mcore-other-", 1)
    assert newest_like(other)[0] == first

