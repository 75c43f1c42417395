"""Golden refresh: only the records' own pins are written, with an old -> new diff; failed or partial sets are refused."""

from __future__ import annotations

import copy
import json

from record_samples import REVISIONS, refresh, run_record, write_records, write_sweep

from harness.cli import main


def test_refresh_writes_only_its_own_pins_and_diffs_against_the_previous_revision(tmp_path, capsys):
    assert refresh(tmp_path, run_record(), run_record("moe_act")) == 0
    (old,) = (tmp_path / "golden").glob("*.json")
    old_bytes = old.read_bytes()
    bumped = copy.deepcopy(REVISIONS)
    bumped["megatron_core"].update(version="0.20.0", fingerprint="0123456789abcdef")
    capsys.readouterr()
    assert (
        main(
            [
                "golden",
                "refresh",
                "--golden-dir",
                str(tmp_path / "golden"),
                *write_records(
                    tmp_path / "m",
                    run_record(revisions=bumped, step_ms=440.0),
                    run_record("moe_act", revisions=bumped),
                ),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert old.read_bytes() == old_bytes
    assert len(list((tmp_path / "golden").glob("*.json"))) == 2
    assert (
        "| [] | step_time_ms | 400.00 | 440.00 | +10.00% |" in out
        and f"previous golden: `{old}`" in out
    )


def test_refresh_refuses_failed_and_partial_sets_unless_told(tmp_path, capsys):
    assert refresh(tmp_path, run_record(), run_record("moe_act", status="oom")) == 2
    assert "failed records" in capsys.readouterr().err
    assert not (tmp_path / "golden").exists()
    assert (
        refresh(
            tmp_path, run_record(), run_record("moe_act", status="oom"), flags=["--allow-failed"]
        )
        == 0
    )
    assert (
        main(
            [
                "golden",
                "refresh",
                "--golden-dir",
                str(tmp_path / "golden"),
                *write_records(tmp_path / "q", run_record()),
            ]
        )
        == 2
    )
    assert "rows moe_act of the previous golden were not measured" in capsys.readouterr().err


def test_a_first_golden_from_an_incomplete_sweep_is_refused_and_every_reader_says_it_is_incomplete(
    tmp_path, capsys
):
    # A runner SIGKILLed (or out of disk) after two of three rows: no previous golden to miss rows of.
    sweep = write_sweep(
        tmp_path / "sweep",
        {"[]": run_record(), "moe_act": run_record("moe_act"), "layernorm": None},
    )
    golden = tmp_path / "golden"
    assert main(["golden", "refresh", "--golden-dir", str(golden), str(sweep)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "refusing a partial record set" in err
        and "no record for row(s) layernorm" in err
    )
    assert not golden.exists()
    assert main(["analyze", "--json", str(sweep / "records")]) == 0
    assert any(
        "no record for row(s) layernorm" in line
        for line in json.loads(capsys.readouterr().out)["conclusions"]
    )
    assert main(["select", "--target-gb", "100", str(sweep)]) == 0
    assert "note: " in capsys.readouterr().err
    assert (
        main(["golden", "refresh", "--golden-dir", str(golden), "--allow-partial", str(sweep)]) == 0
    )
    assert (
        main(["compare", "--golden-dir", str(golden), str(sweep)]) == 0
    )  # the golden's rows were all measured
    assert "incomplete sweep" in capsys.readouterr().err


def test_cpu_run_records_never_become_timing_goldens(tmp_path, capsys):
    # The CPU runner's records (cpu-moonlight-ep2) carry step times that vary far beyond tolerance.
    cpu = run_record()
    cpu.hardware.device, cpu.hardware.sm = "cpu", None
    assert refresh(tmp_path, cpu) == 2
    err = capsys.readouterr().err
    assert "cannot become a timing golden" in err and err.count("\n") == 1
    assert not (tmp_path / "golden").exists()


def test_refresh_refuses_when_a_previous_golden_of_the_recipe_is_malformed(tmp_path, capsys):
    assert refresh(tmp_path, run_record(), run_record("moe_act")) == 0
    (old,) = (tmp_path / "golden").glob("*.json")
    broken = old.with_name(
        old.name.replace(".json", "-old.json").replace("__mcore", "__mcore-old", 1)
    )
    text = old.read_text().replace('"kind": "run"', '"kind": "banana"')
    broken.write_text(text)
    bumped = copy.deepcopy(REVISIONS)
    bumped["megatron_core"].update(version="0.20.0", fingerprint="0123456789abcdef")
    capsys.readouterr()
    assert (
        main(
            [
                "golden",
                "refresh",
                "--golden-dir",
                str(tmp_path / "golden"),
                *write_records(
                    tmp_path / "m",
                    run_record(revisions=bumped),
                    run_record("moe_act", revisions=bumped),
                ),
            ]
        )
        == 2
    )
    assert str(broken) in capsys.readouterr().err
    assert len(list((tmp_path / "golden").glob("*.json"))) == 2  # nothing new written


def test_a_symlinked_golden_stays_a_symlink(tmp_path):
    assert refresh(tmp_path, run_record(), run_record("moe_act")) == 0
    (golden,) = (tmp_path / "golden").glob("*.json")
    kept = tmp_path / "kept.json"
    golden.rename(kept)
    golden.symlink_to(kept)
    assert (
        refresh(
            tmp_path / "again",
            run_record(step_ms=410.0),
            run_record("moe_act"),
            flags=["--golden-dir", str(tmp_path / "golden")],
        )
        == 0
    )
    assert golden.is_symlink() and '"step_time_ms": 410.0' in kept.read_text()
