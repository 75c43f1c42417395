"""How the nightly judges a sweep (harness/run/nightly.py, issue 36 items 2 and 3): by the golden of
the records' exact pins; a seed study on other pins by its card golden's effects; a case without a
golden fails in one line naming the case, the stack's pins and the refresh command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from record_samples import write_records

from harness.config.revisions import collect_revisions
from harness.record.io import load_records
from harness.record.model import Revisions
from harness.run.nightly import NIGHTLY_CASES, judgement, missing_golden_line, nightly_case
from harness.run.recipes import load_recipe

SEED_RECORDS = (
    Path(__file__).resolve().parents[3] / "harness/data/reference/seed-moonlight-full-8gpu.json"
)


def test_every_case_is_a_recipe_the_runner_can_load():
    for case in NIGHTLY_CASES:
        assert load_recipe(case.recipe).world_size == case.needs["gpus"], case.recipe
    assert [case.recipe for case in NIGHTLY_CASES if case.seed_study] == ["moonlight-full-8gpu"]


def test_a_seed_study_on_tonights_pins_is_judged_by_its_card_golden_on_effects(tmp_path):
    installed = Revisions.from_json(collect_revisions())
    tonight = [replace(record, revisions=installed) for record in load_records([SEED_RECORDS])]
    write_records(tmp_path, *tonight)
    how, golden = judgement(tmp_path / "records")
    assert how == "effects"
    assert Path(golden).name.startswith("moonlight-full-8gpu__H100_80GBx8__mcore-24bad8e677d2")


def test_the_card_pins_themselves_are_judged_exactly(tmp_path):
    write_records(tmp_path, *load_records([SEED_RECORDS]))
    how, golden = judgement(tmp_path / "records")
    assert how == "exact" and "mcore-24bad8e677d2" in golden


def test_a_case_without_a_golden_names_the_case_the_pins_and_the_refresh():
    pins = Revisions.from_json(collect_revisions()).pins()
    line = missing_golden_line(nightly_case("mcore-moonlight-2gpu"), pins)
    version = pins["megatron_core"]["version"]
    assert line.startswith(
        f"mcore-moonlight-2gpu: no golden for the installed stack (megatron-core {version} ("
    )
    assert line.endswith("write one on this runner with: ci/golden-refresh.sh mcore-moonlight-2gpu")
    assert "\n" not in line
