"""The nightly's one list of compared cases, the golden each is compared with, and the seed studies'
effect-only comparison on revisions other than the card's (issue 36, defects 4 and 5)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from record_samples import REVISIONS

from harness.cli import main
from harness.errors import UsageError
from harness.golden.judge import EFFECT_ONLY_TOLERANCE, compare_effects, compare_records
from harness.golden.nightly import NIGHTLY_CASES, case_named, golden_for, judge
from harness.golden.seed import DEFAULT_CARD, RECORDS_DIR, load_sources, transcribe
from harness.golden.store import CHECKOUT_ROOT as GOLDEN_DIR
from harness.golden.store import golden_filename_for
from harness.record.metrics import MetricName
from harness.record.model import Record, Revisions
from harness.run.recipes import load_recipe

# The nightly image's stack: Megatron Core 0.19.2 (a wheel: version + fingerprint), Bridge 0.6.2.
NIGHT = {**REVISIONS, "megatron_bridge": {"version": "0.6.2", "commit": None}}


def _moonlight(card: Path = DEFAULT_CARD) -> list[Record]:
    """The card's Moonlight study as records (the seed transcription), run on the night's stack."""
    records = transcribe(card, load_sources(RECORDS_DIR))["moonlight-full-8gpu"]
    return [dataclasses.replace(r, revisions=Revisions.from_json(NIGHT)) for r in records]


def test_every_case_is_a_gpu_recipe_of_the_runners_and_named_once():
    names = [case.recipe for case in NIGHTLY_CASES]
    assert len(set(names)) == len(names)
    for case in NIGHTLY_CASES:
        assert case.loaded.device == "cuda" and case.hardware["gpu_count"] == case.loaded.world_size
    # The GPU tier's cases: the two mcore layouts, the two short Bridge recipes at EP 8 (their goldens
    # were refreshed and never compared before), the Moonlight seed study (issue 36, defect 5).
    assert names == [
        "mcore-moonlight-1gpu",
        "mcore-moonlight-2gpu",
        "moonlight-short-8gpu",
        "nemotron-3-nano-short-8gpu",
        "moonlight-full-8gpu",
    ]


def test_the_seed_study_on_other_revisions_is_compared_by_effects_with_the_cards_golden():
    # Before issue 36 the seed test looked for a golden of the night's exact pins only and failed
    # every night on the card's pins (defect 4): the card's golden exists, and is chosen, effect-only.
    found = golden_for(
        case_named("moonlight-full-8gpu"), Revisions.from_json(NIGHT).pins(), GOLDEN_DIR
    )
    card_golden = GOLDEN_DIR / golden_filename_for(
        transcribe(DEFAULT_CARD)["moonlight-full-8gpu"][0]
    )
    assert (found.path, found.effect_only) == (card_golden, True)


def test_a_case_without_a_golden_of_the_installed_pins_names_case_pins_and_refresh(tmp_path):
    found = golden_for(
        case_named("mcore-moonlight-2gpu"), Revisions.from_json(NIGHT).pins(), tmp_path
    )
    assert found.path is None
    assert found.missing_line(Revisions.from_json(NIGHT).pins()) == (
        "no golden for mcore-moonlight-2gpu on H100_80GBx2 pinned to the installed stack "
        "(megatron_core 0.19.2 feedfacecafebeef, megatron_bridge 0.6.2, torch 2.14.1, cuda 13.0): "
        "write it on the GPU runner with ci/golden-refresh.sh mcore-moonlight-2gpu"
    )
    with pytest.raises(UsageError, match="no golden for mcore-moonlight-2gpu"):
        judge(found, [])


def test_the_cards_own_study_on_the_nights_stack_passes_effect_only_with_both_revision_sets():
    records = _moonlight()
    found = golden_for(case_named("moonlight-full-8gpu"), records[0].pins(), GOLDEN_DIR)
    with pytest.raises(UsageError, match="refusing to compare"):  # absolutes: never across pins
        compare_records(found.golden, records, str(found.path))
    comparison = judge(found, records)
    assert comparison.passed, comparison.failures
    assert comparison.effect_only is not None
    assert "megatron_core 0.19.2 feedfacecafebeef, megatron_bridge 0.6.2" in comparison.effect_only
    assert "megatron_core 0.20.0 24bad8e677d2 55bd569308a87514" in comparison.effect_only
    # Judged: each row's stage; each recompute row's saving and cost. No absolute value.
    judged = {(check.label, check.metric) for check in comparison.checks}
    assert ("[]", "outcome") in judged and ("moe_act", MetricName.SAVING_ALLOCATED_PCT) in judged
    assert not {metric for _, metric in judged} & {MetricName.PEAK_ALLOCATED_BYTES, "step_time_ms"}


def test_effects_outside_the_cards_tolerances_fail_and_inside_pass(tmp_path):
    card = yaml.safe_load(DEFAULT_CARD.read_text(encoding="utf-8"))
    moonlight = {row["name"]: row for row in card["measured_results"][0]["experiments"]}
    for row in card["measured_results"][0][
        "experiments"
    ]:  # another revision: every peak 2 GB lower,
        row["peak_mem_gb"] -= 2.0  # every step 10 % slower (absolutes move, effects barely)
        row["step_time_ms"] *= 1.1
    moonlight["moe_act"]["peak_mem_gb"] = 32.618  # saves 2.0 GB of 34.618 = 5.78 % (card 1.85 %)
    # Cost 4.5 % (card 3.85 %: +0.65 pp, inside 0.9 pp).
    moonlight["core_attn"]["step_time_ms"] = 457.18 * 1.1 * 1.045
    mutated = tmp_path / "card.yaml"
    mutated.write_text(yaml.safe_dump(card), encoding="utf-8")
    records = _moonlight(mutated)
    found = golden_for(case_named("moonlight-full-8gpu"), records[0].pins(), GOLDEN_DIR)
    failures = [(c.label, c.metric, c.verdict) for c in judge(found, records).failures]
    assert failures == [
        (
            "moe_act",
            MetricName.SAVING_ALLOCATED_PCT,
            "FAIL: saving grew beyond tolerance, refresh the golden",
        )
    ]
    assert EFFECT_ONLY_TOLERANCE[MetricName.STEP_TIME_COST_PCT]["abs"] == 0.9  # 0.65 pp passed


def test_an_effect_only_comparison_needs_the_same_nights_control():
    records = [r for r in _moonlight() if not r.recompute.is_control]
    found = golden_for(case_named("moonlight-full-8gpu"), records[0].pins(), GOLDEN_DIR)
    with pytest.raises(UsageError, match=r"needs the \[\] control"):
        compare_effects(found.golden, records, str(found.path))


def test_list_prints_case_and_golden_per_line(capsys):
    assert main(["nightly", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [case.recipe for case in NIGHTLY_CASES]
    assert all(len(line.split()) == 2 for line in lines)


def test_recipes_are_the_cases(capsys):
    assert main(["nightly", "recipes"]) == 0
    assert capsys.readouterr().out.split() == [case.recipe for case in NIGHTLY_CASES]
    assert all(load_recipe(name) for name in (case.recipe for case in NIGHTLY_CASES))


def test_the_docs_name_every_case():
    # docs/runner.md's nightly section lists the cases in words; a case added here must appear there.
    text = (Path(__file__).parents[3] / "docs" / "runner.md").read_text(encoding="utf-8")
    section = text.split("## The nightly GPU tier", 1)[1].split("\n## ", 1)[0]
    assert [case.recipe for case in NIGHTLY_CASES if f"`{case.recipe}`" not in section] == []
