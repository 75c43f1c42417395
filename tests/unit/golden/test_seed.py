"""The skill card's measured results, transcribed, and the analysis reaching the skill's conclusions."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from mcore_checkout import git_head, mcore_checkout

from harness.cli import main
from harness.compare.analysis import analyse
from harness.compare.selection import select
from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.golden.seed import (
    DEFAULT_CARD,
    PROVENANCE_SOURCE,
    RECORDS_DIR,
    SOURCES_FILE,
    load_sources,
    write_seed,
)
from harness.golden.seed import main as seed_main
from harness.golden.store import CHECKOUT_ROOT as GOLDEN_DIR
from harness.golden.store import load_golden, near_misses, resolve_golden
from harness.record.io import load_records

CARD = yaml.safe_load(DEFAULT_CARD.read_text())
STUDIES = {study["model"]: study for study in CARD["measured_results"]}
MOONLIGHT = RECORDS_DIR / "seed-moonlight-full-8gpu.json"
NEMOTRON = RECORDS_DIR / "seed-nemotron-3-nano-full-16gpu.json"
LLAMA = RECORDS_DIR / "seed-llama3-70b-sft-pr3107.json"


def test_committed_seed_files_are_exactly_what_the_transcription_writes(tmp_path):
    (tmp_path / "records").mkdir()
    shutil.copy(
        RECORDS_DIR / SOURCES_FILE, tmp_path / "records"
    )  # derived once from the card's commit
    written = write_seed(DEFAULT_CARD, tmp_path / "records", tmp_path / "golden")
    for path in written:
        committed = (RECORDS_DIR if path.parent.name == "records" else GOLDEN_DIR) / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: run python -m harness.golden.seed"
        )
    assert (
        len(written) == 5
    )  # three record sets, two goldens (the Llama rows carry no revision pins)


def test_seed_goldens_carry_the_derived_sources_of_their_commit_and_judge_a_wheel_of_them():
    sources = load_sources(RECORDS_DIR)
    goldens = [load_golden(path) for path in GOLDEN_DIR.glob("*__mcore-24bad8e677d2__*.json")]
    assert len(goldens) == 2
    for golden in goldens:
        mcore = golden.pins["megatron_core"]
        assert {key: mcore[key] for key in ("version", "fingerprint")} == sources[mcore["commit"]]
    # The same sources installed without a commit (a wheel, a copied tree): judged by the seed golden.
    wheel = [
        replace(
            record,
            revisions=replace(
                record.revisions, megatron_core=replace(record.revisions.megatron_core, commit=None)
            ),
        )
        for record in load_records([MOONLIGHT])
    ]
    assert resolve_golden(wheel, GOLDEN_DIR).name.startswith(
        "moonlight-full-8gpu__H100_80GBx8__mcore-24bad8e677d2"
    )
    # The installed 0.19.2 is other sources (8 of its 21 recompute files differ): no golden judges it.
    installed = collect_revisions()["megatron_core"]
    other = [
        replace(
            record,
            revisions=replace(
                record.revisions,
                megatron_core=replace(
                    record.revisions.megatron_core,
                    commit=None,
                    version=installed["version"],
                    fingerprint=installed["fingerprint"],
                ),
            ),
        )
        for record in load_records([MOONLIGHT])
    ]
    assert not resolve_golden(other, GOLDEN_DIR).exists()
    assert (
        f"fingerprint {sources[goldens[0].pins['megatron_core']['commit']]['fingerprint']} != "
        f"{installed['fingerprint']}" in near_misses(other, resolve_golden(other, GOLDEN_DIR))
    )


def _card_pinned_to(tmp_path, commit: str) -> Path:
    card = yaml.safe_load(DEFAULT_CARD.read_text())
    for study in card["measured_results"]:
        if (study.get("revisions") or {}).get("megatron_core"):
            study["revisions"]["megatron_core"] = commit
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(card))
    return path


def test_derived_sources_come_from_a_clean_checkout_at_the_pinned_commit(tmp_path, capsys):
    repo = mcore_checkout(tmp_path)  # a real git work tree of the installed Megatron Core's sources
    commit = git_head(repo)
    records_dir, golden_dir = tmp_path / "records", tmp_path / "golden"
    records_dir.mkdir()
    # The real card pins 24bad8e6, not this tree: refused in one line, nothing written.
    assert (
        seed_main(
            [
                "--records-dir",
                str(records_dir),
                "--golden-dir",
                str(golden_dir),
                "--mcore-tree",
                str(repo),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"at commit {commit}, which no card study pins" in err
    assert not any(records_dir.iterdir()) and not golden_dir.exists()
    card = _card_pinned_to(tmp_path, commit)
    assert (
        seed_main(
            [
                "--card",
                str(card),
                "--records-dir",
                str(records_dir),
                "--golden-dir",
                str(golden_dir),
                "--mcore-tree",
                str(repo),
            ]
        )
        == 0
    )
    installed = collect_revisions()["megatron_core"]
    assert load_sources(records_dir) == {
        commit: {"version": installed["version"], "fingerprint": installed["fingerprint"]}
    }
    (golden_path,) = golden_dir.glob("moonlight-*.json")
    assert load_golden(golden_path).pins["megatron_core"] == {
        "version": installed["version"],
        "commit": commit,
        "fingerprint": installed["fingerprint"],
    }
    # Without the tree, the derivation on disk reproduces the pins; an edited tree is refused.
    before = golden_path.read_text()
    assert (
        seed_main(
            [
                "--card",
                str(card),
                "--records-dir",
                str(records_dir),
                "--golden-dir",
                str(golden_dir),
            ]
        )
        == 0
    )
    assert golden_path.read_text() == before
    config = repo / "megatron" / "core" / "transformer" / "transformer_config.py"
    config.write_text(config.read_text() + "\n# local edit\n")
    capsys.readouterr()
    assert (
        seed_main(
            ["--card", str(card), "--records-dir", str(records_dir), "--mcore-tree", str(repo)]
        )
        == 2
    )
    assert "has local changes" in capsys.readouterr().err


def test_rows_pins_and_provenance():
    moonlight, nemotron, llama = (load_records([p]) for p in (MOONLIGHT, NEMOTRON, LLAMA))
    assert [len(moonlight), len(nemotron), len(llama)] == [6, 6, 4]
    for record in moonlight + nemotron:
        assert (
            record.revisions.megatron_core.commit
            == STUDIES[record.workload.model]["revisions"]["megatron_core"]
        )
        assert (
            record.revisions.megatron_bridge.commit
            == STUDIES[record.workload.model]["revisions"]["bridge"]
        )
    assert all(r.provenance["source"] == PROVENANCE_SOURCE for r in moonlight + nemotron + llama)
    ooms = [r for r in nemotron if r.outcome.status == "oom"]
    assert len(ooms) == 4 and all(r.outcome.iteration in (1, 2) and r.outcome.site for r in ooms)


def test_peaks_are_the_card_values_in_bytes():
    for path, study in (
        (MOONLIGHT, STUDIES["Moonlight 16B"]),
        (NEMOTRON, STUDIES["Nemotron 3 Nano"]),
    ):
        by_row = {r.provenance["row"]: r for r in load_records([path])}
        for row in study["experiments"]:
            peak = row.get("peak_mem_gb", row.get("peak_mem_gb_after_iteration_1"))
            actual = by_row[row["name"]].headline["peak_allocated_bytes"]
            assert (actual is None and peak is None) or actual / 1e9 == pytest.approx(peak)


def test_moonlight_analysis_reaches_the_skill_conclusion_and_the_card_percentages():
    analysis = analyse(load_records([MOONLIGHT]))
    ranked = [
        row.label for row in sorted((r for r in analysis.rows if r.rank), key=lambda r: r.rank)
    ]
    assert ranked == ["moe_act", "mla_up_proj"]
    rows = {row.label: row for row in analysis.rows}
    assert rows["core_attn"].rank is None and "no material" in rows["core_attn"].note
    for experiment in STUDIES["Moonlight 16B"]["experiments"]:
        row = rows["+".join(experiment["recompute_modules"]) or "[]"]
        if "peak_mem_vs_control_pct" in experiment:
            assert round(row.allocated_vs_control_pct, 2) == experiment["peak_mem_vs_control_pct"]
            assert round(row.time_vs_control_pct, 2) == experiment["step_time_vs_control_pct"]


def test_nemotron_analysis_whole_moe_passes_first_and_moe_act_advanced_but_failed():
    analysis = analyse(load_records([NEMOTRON]))
    rows = {row.label: row for row in analysis.rows}
    assert rows["moe"].rank == 1 and rows["moe+layernorm"].rank == 2
    assert rows["moe_act"].verdict == "advanced-but-failed"
    card_moe_act = next(
        e for e in STUDIES["Nemotron 3 Nano"]["experiments"] if e["name"] == "moe_act"
    )
    assert (
        round(rows["moe_act"].allocated_vs_control_pct, 2)
        == card_moe_act["peak_mem_vs_control_pct_at_iteration_1"]
    )
    assert {rows["core_attn"].verdict, rows["layernorm+moe_act"].verdict} == {"failed"}
    assert not any(row.verdict == "pass" for row in analysis.rows if row.status != "completed")
    extra = next(
        e for e in STUDIES["Nemotron 3 Nano"]["experiments"] if e["name"] == "moe_plus_layernorm"
    )
    moe, both = rows["moe"], rows["moe+layernorm"]
    assert (
        round((both.peak_allocated_gb - moe.peak_allocated_gb) / moe.peak_allocated_gb * 100, 2)
        == extra["peak_mem_vs_moe_pct"]
    )
    assert (
        round((both.step_time_ms - moe.step_time_ms) / moe.step_time_ms * 100, 2)
        == extra["step_time_vs_moe_pct"]
    )


def test_llama_rows_cannot_be_ranked_without_a_matched_control(capsys):
    with pytest.raises(UsageError, match=r"no matched \[\] control"):
        analyse(load_records([LLAMA]))
    assert main(["analyze", str(LLAMA)]) == 2


def test_studies_together_are_refused_and_told_why(capsys):
    assert main(["analyze", str(MOONLIGHT), str(NEMOTRON)]) == 2
    err = capsys.readouterr().err
    assert "not a matched set" in err and "model" in err and "parallelism.tp" in err


@pytest.mark.parametrize(
    ("path", "target", "expected"),
    [
        (MOONLIGHT, 40.0, "[]"),
        (MOONLIGHT, 36.0, "moe_act"),
        (MOONLIGHT, 35.92, "mla_up_proj"),
        (NEMOTRON, 65.0, "moe"),
        (NEMOTRON, 64.0, "moe+layernorm"),
    ],
)
def test_select_cheapest_completed_row_under_target(path, target, expected):
    assert select(load_records([path]), target).chosen == expected


def test_select_exit_1_when_nothing_fits_and_never_picks_a_failed_row(capsys):
    # moe_act's 62.1 GB is under 63 GB but it never completed a step: no selection.
    assert main(["select", "--target-gb", "63", str(NEMOTRON)]) == 1
    assert "moe_act | did not complete" in capsys.readouterr().out


def test_select_refuses_bad_target(capsys):
    assert main(["select", "--target-gb", "nan", str(MOONLIGHT)]) == 2
