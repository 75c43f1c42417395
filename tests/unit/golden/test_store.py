"""The golden root: one place names it (option, environment, checkout) and finds a records' golden."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from record_samples import REVISIONS, run_record, write_records

from harness.cli import main
from harness.errors import UsageError
from harness.golden.store import (
    CHECKOUT_ROOT,
    ENV_VAR,
    golden_path_for,
    golden_root,
    newest_like,
    resolve_golden,
)
from harness.record.io import write_record


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
    assert (
        main(
            ["golden", "refresh", "--golden-dir", str(root), *write_records(tmp_path, run_record())]
        )
        == 0
    )
    (first,) = root.glob("*.json")
    assert newest_like(first)[0] == first
    other = root / first.name.replace("mcore-", "mcore-other-", 1)
    assert newest_like(other)[0] == first


def test_a_golden_pinned_by_commit_and_fingerprint_judges_a_wheel_and_a_submodule_of_those_sources(
    tmp_path, capsys
):
    # The golden is named by the commit (a submodule checkout at that commit wrote it); a wheel of the
    # same sources carries no commit, so its records name another file, and are still judged by this one.
    submodule = {
        **REVISIONS,
        "megatron_core": {
            "version": "0.19.2",
            "commit": "c" * 40,
            "fingerprint": "feedfacecafebeef",
        },
    }
    root = tmp_path / "goldens"
    records = [
        run_record(revisions=submodule),
        run_record("moe_act", peak=29_000_000_000, revisions=submodule),
    ]
    assert (
        main(["golden", "refresh", "--golden-dir", str(root), *write_records(tmp_path, *records)])
        == 0
    )
    (written,) = root.glob("*.json")
    assert "mcore-cccccccccccc" in written.name
    wheel = [
        run_record(),
        run_record("moe_act", peak=29_000_000_000),
    ]  # version + fingerprint, no commit
    assert golden_path_for(wheel, root) != written and resolve_golden(wheel, root) == written
    assert (
        main(["compare", "--golden-dir", str(root), *write_records(tmp_path / "wheel", *wheel)])
        == 0
    )
    other_sources = {
        **REVISIONS,
        "megatron_core": {**REVISIONS["megatron_core"], "fingerprint": "0123456789abcdef"},
    }
    edited = [
        run_record(revisions=other_sources),
        run_record("moe_act", peak=29_000_000_000, revisions=other_sources),
    ]
    assert (
        resolve_golden(edited, root) == golden_path_for(edited, root)
        and not golden_path_for(edited, root).exists()
    )
    capsys.readouterr()
    assert (
        main(["compare", "--golden-dir", str(root), *write_records(tmp_path / "edited", *edited)])
        == 2
    )
    refused = capsys.readouterr().err
    assert (
        "no golden" in refused
        and "megatron_core.fingerprint feedfacecafebeef != 0123456789abcdef" in refused
    )


def test_a_golden_dir_that_does_not_exist_is_one_line_exit_2(tmp_path, capsys):
    records = write_records(tmp_path, run_record())
    assert main(["compare", "--golden-dir", str(tmp_path / "missing"), *records]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"golden directory {tmp_path / 'missing'} does not exist" in err
    assert not (tmp_path / "missing").exists()


def _build_outputs(checkout: Path) -> set[str]:
    return {p.name for p in checkout.iterdir() if p.name == "build" or p.suffix == ".egg-info"}


@pytest.mark.slow
def test_a_non_editable_install_finds_its_shipped_goldens_and_refuses_to_write_them(tmp_path):
    # pip builds a source tree in place (build/, *.egg-info): it builds a copy of what the wheel is
    # made of, so the test writes nothing into the checkout.
    checkout = CHECKOUT_ROOT.parents[1]
    built_before = _build_outputs(checkout)
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(checkout / "harness", source / "harness", symlinks=True, ignore=ignore)
    shutil.copytree(CHECKOUT_ROOT, source / "tests" / "golden", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(checkout / name, source / name)
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shipped = target / "harness" / "data" / "golden"
    assert (
        not shipped.is_symlink()
    )  # a real copy in the install, the checkout's tests/golden its source
    assert sorted(p.relative_to(shipped) for p in shipped.rglob("*.json")) == sorted(
        p.relative_to(CHECKOUT_ROOT) for p in CHECKOUT_ROOT.rglob("*.json")
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)}
    root = subprocess.run(
        [
            sys.executable,
            "-c",
            "from harness.golden.store import golden_root; print(golden_root())",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert root.stdout.strip() == str(shipped), root.stderr
    records = write_records(tmp_path, run_record())
    refused = subprocess.run(
        [sys.executable, "-m", "harness.cli", "golden", "refresh", *records],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "refusing to write into the goldens shipped with the package" in refused.stderr
    assert sorted(p.name for p in shipped.glob("*.json")) == sorted(
        p.name for p in CHECKOUT_ROOT.glob("*.json")
    )
    assert list(work.iterdir()) == []  # no ./tests/golden, nothing at all in the working directory
    # The same install registers the pytest plugin for any repo's test run (entry point pytest11).
    (entry_points,) = target.glob("recompute_harness-*.dist-info/entry_points.txt")
    assert "[pytest11]\nharness.pytest_plugin = harness.pytest_plugin" in entry_points.read_text()
    assert (
        _build_outputs(checkout) == built_before
    )  # pip wrote no build/ or *.egg-info into the checkout


def test_refresh_json_and_a_dry_run_marked_as_such_in_the_step_summary(
    tmp_path, monkeypatch, capsys
):
    import json

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    records = write_records(tmp_path, run_record())
    assert (
        main(["golden", "refresh", "--golden-dir", str(tmp_path / "g"), "--dry-run", *records]) == 0
    )
    assert "(dry run: nothing written)" in capsys.readouterr().out
    assert "### Golden refresh (dry run: nothing written)" in summary.read_text()
    assert not (tmp_path / "g").exists()
    assert main(["golden", "refresh", "--golden-dir", str(tmp_path / "g"), "--json", *records]) == 0
    (written,) = json.loads(capsys.readouterr().out)["goldens"]
    assert written["written"] and (tmp_path / "g" / written["path"].split("/")[-1]).is_file()
    assert (
        summary.read_text().count("### Golden refresh") == 1
    )  # --json leaves the step summary alone
