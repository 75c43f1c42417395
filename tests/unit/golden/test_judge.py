"""The comparator: per-metric verdicts against a golden, refusals on other pins or hardware."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from record_samples import REVISIONS, refresh, run_json, run_record, write_records

from harness.cli import main
from harness.errors import UsageError
from harness.golden.format import golden_values as golden_values_of
from harness.golden.format import validate_golden
from harness.golden.judge import compare_records
from harness.golden.seed import DEFAULT_CARD, RECORDS_DIR, load_sources, transcribe
from harness.golden.store import CHECKOUT_ROOT as GOLDEN_DIR
from harness.golden.store import golden_filename_for, load_golden
from harness.record.model import Record


def _card_records(card: Path) -> dict[str, list[Record]]:
    """The card's studies as records, through the seed transcription (pins from mcore-sources.json)."""
    return transcribe(card, load_sources(RECORDS_DIR))


def _committed_golden(records: list[Record]):
    path = GOLDEN_DIR / golden_filename_for(records[0])
    return load_golden(path), str(path)


def test_the_cards_numbers_as_written_pass_the_committed_goldens():
    # The goldens on disk were written by an earlier transcription and committed; here the card is read
    # afresh. Both studies with a committed golden (the Llama study's revisions have none) pass, and
    # every row of each golden is judged.
    studies = _card_records(DEFAULT_CARD)
    for recipe in ("moonlight-full-8gpu", "nemotron-3-nano-full-16gpu"):
        golden, path = _committed_golden(studies[recipe])
        comparison = compare_records(golden, studies[recipe], path)
        assert comparison.passed, comparison.failures
        assert {check.label for check in comparison.checks} == {row.label for row in golden.rows}


def test_a_card_copy_with_two_numbers_changed_fails_exactly_there(tmp_path):
    card = yaml.safe_load(DEFAULT_CARD.read_text(encoding="utf-8"))
    moonlight = {row["name"]: row for row in card["measured_results"][0]["experiments"]}
    moonlight["core_attn"]["peak_mem_gb"] = 35.614  # card: 36.614 (a 1 GB larger saving)
    moonlight["mla_up_proj"]["step_time_ms"] = 520.0  # card: 480.89
    mutated = tmp_path / "card.yaml"
    mutated.write_text(yaml.safe_dump(card), encoding="utf-8")
    records = _card_records(mutated)["moonlight-full-8gpu"]
    golden, path = _committed_golden(records)
    failures = sorted(
        (c.label, c.metric, c.golden, c.actual, c.verdict)
        for c in compare_records(golden, records, path).failures
    )
    grew = "FAIL: saving grew beyond tolerance, refresh the golden"
    assert failures == [
        # control 36.618 GB: the saving was 36.618 - 36.614 = 0.004 GB, now 1.004 GB
        ("core_attn", "saving_allocated_bytes", 4_000_000, 1_004_000_000, grew),
        # 0.004 / 36.618 = 0.0109 %, now 1.004 / 36.618 = 2.742 %
        (
            "core_attn",
            "saving_allocated_pct",
            pytest.approx(0.010924, abs=1e-6),
            pytest.approx(2.741821, abs=1e-6),
            grew,
        ),
        # control 457.18 ms: (480.89 - 457.18) / 457.18 = 5.186 %, now (520 - 457.18) / 457.18 = 13.741 %
        (
            "mla_up_proj",
            "step_time_cost_pct",
            pytest.approx(5.186141, abs=1e-6),
            pytest.approx(13.740759, abs=1e-6),
            "FAIL: cost grew beyond tolerance",
        ),
    ]


def test_refresh_then_compare_passes_then_regression_and_improvement_fail(tmp_path, capsys):
    assert refresh(tmp_path, run_record(), run_record("moe_act", peak=29_000_000_000)) == 0
    (golden,) = (tmp_path / "golden").glob("*.json")
    baseline = [run_record(), run_record("moe_act", peak=29_000_000_000)]
    assert compare_records(load_golden(golden), baseline, str(golden)).passed
    # moe_act saved 1 GB (3.3 %) at the golden; now it holds 1 GB more than the control.
    worse = compare_records(
        load_golden(golden), [run_record(), run_record("moe_act", peak=31_000_000_000)], str(golden)
    )
    assert {(c.label, c.metric, c.verdict) for c in worse.failures} == {
        ("moe_act", "saving_allocated_bytes", "FAIL: saving shrank beyond tolerance"),
        ("moe_act", "saving_allocated_pct", "FAIL: saving lost"),
        ("moe_act", "reserved_change_pct", "FAIL: regressed"),
    }
    # Memory that grows only after iteration 2 (a CUDA-graph pool, a leak) leaves the headline alone
    # and fails the run peak (+3.3 % allocated against ±2 %; reserved +3.2 % is inside its ±5 %).
    grew = compare_records(
        load_golden(golden), [run_record(growth_after=4), baseline[1]], str(golden)
    )
    assert {(c.label, c.metric, c.verdict) for c in grew.failures} == {
        ("[]", "run_peak_allocated_bytes", "FAIL: regressed")
    }
    # A faster control alone: its own time moved, and moe_act now costs 33 % more than it.
    faster = compare_records(
        load_golden(golden), [run_record(step_ms=300.0), baseline[1]], str(golden)
    )
    assert {(c.label, c.metric, c.verdict) for c in faster.failures} == {
        ("[]", "step_time_ms", "FAIL: improved beyond tolerance, refresh the golden"),
        ("moe_act", "step_time_cost_pct", "FAIL: cost grew beyond tolerance"),
    }
    capsys.readouterr()
    assert (
        main(
            [
                "compare",
                "--golden",
                str(golden),
                *write_records(
                    tmp_path / "w", run_record(), run_record("moe_act", peak=31_000_000_000)
                ),
            ]
        )
        == 1
    )
    table = capsys.readouterr().out
    assert (
        "| moe_act | saving_allocated_bytes | 1.000 GB | -1.000 GB | -2000 MB | ±20% (≥ 0.05 GB) | FAIL: saving shrank beyond tolerance |"
        in table
    )


def test_changed_outcome_and_missing_row_fail(tmp_path):
    assert refresh(tmp_path, run_record(), run_record("moe_act")) == 0
    (golden,) = (tmp_path / "golden").glob("*.json")
    comparison = compare_records(load_golden(golden), [run_record(status="oom")], str(golden))
    verdicts = {(c.label, c.metric): c.verdict for c in comparison.failures}
    assert verdicts[("[]", "outcome")] == "FAIL: now fails where it passed"
    assert verdicts[("moe_act", "row")] == "FAIL: row not measured"


def test_compare_refuses_other_pins_and_names_the_refresh_command(tmp_path, capsys):
    assert refresh(tmp_path, run_record()) == 0
    (golden,) = (tmp_path / "golden").glob("*.json")
    bumped = copy.deepcopy(REVISIONS)
    bumped["megatron_core"]["fingerprint"] = "0123456789abcdef"
    capsys.readouterr()
    assert (
        main(
            [
                "compare",
                "--golden",
                str(golden),
                *write_records(tmp_path / "b", run_record(revisions=bumped)),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "megatron_core.fingerprint feedfacecafebeef != 0123456789abcdef" in err
    assert "recompute-harness golden refresh" in err and err.count("\n") == 1
    with pytest.raises(UsageError, match="hardware.gpu_count"):
        compare_records(load_golden(golden), [run_record(gpus=4)], str(golden))


# --- effects against the matched [] control --------------------------------------------------------
# The golden: moe_act saves 2 % (600 MB) and costs 2 % step time, like the Moonlight card's moe_act.
def _effect_golden(tmp_path):
    assert (
        refresh(tmp_path, run_record(), run_record("moe_act", peak=29_400_000_000, step_ms=408.0))
        == 0
    )
    (golden,) = (tmp_path / "golden").glob("*.json")
    return load_golden(golden), str(golden)


def _failures(golden, path, *records):
    return {
        (c.label, c.metric, c.verdict)
        for c in compare_records(golden, list(records), path).failures
    }


def test_a_lost_saving_fails_although_every_absolute_value_is_inside_its_tolerance(tmp_path):
    golden, path = _effect_golden(tmp_path)
    assert (
        _failures(
            golden, path, run_record(), run_record("moe_act", peak=29_400_000_000, step_ms=408.0)
        )
        == set()
    )
    lost = _failures(
        golden, path, run_record(), run_record("moe_act", step_ms=408.0)
    )  # peak = the control's
    assert ("moe_act", "saving_allocated_pct", "FAIL: saving lost") in lost
    assert ("moe_act", "saving_allocated_bytes", "FAIL: saving shrank beyond tolerance") in lost


def test_a_tripled_cost_fails(tmp_path):
    golden, path = _effect_golden(tmp_path)
    tripled = _failures(
        golden, path, run_record(), run_record("moe_act", peak=29_400_000_000, step_ms=424.0)
    )
    assert tripled == {("moe_act", "step_time_cost_pct", "FAIL: cost grew beyond tolerance")}


def test_a_label_that_neither_saves_nor_costs_became_inactive(tmp_path):
    golden, path = _effect_golden(tmp_path)
    inactive = _failures(golden, path, run_record(), run_record("moe_act"))
    assert ("moe_act", "saving_allocated_pct", "FAIL: became inactive") in inactive


def test_a_uniform_shift_passes_the_effects_and_shows_as_a_shift_of_the_control(tmp_path):
    golden, path = _effect_golden(tmp_path)
    slower = compare_records(
        golden,
        [
            run_record(step_ms=400.0 * 1.08),
            run_record("moe_act", peak=29_400_000_000, step_ms=408.0 * 1.08),
        ],
        path,
    )
    assert slower.passed  # +8 % on every row: inside the control's ±10 %, effects unchanged
    shift = next(c for c in slower.checks if (c.label, c.metric) == ("[]", "step_time_ms"))
    assert shift.delta_pct == pytest.approx(8.0)
    much = _failures(
        golden,
        path,
        run_record(step_ms=480.0),
        run_record("moe_act", peak=29_400_000_000, step_ms=489.6),
    )
    assert much == {("[]", "step_time_ms", "FAIL: regressed")}  # the machine, not moe_act


def test_outcome_stages_compare_at_the_goldens_precision(tmp_path):
    golden, path = _effect_golden(tmp_path)
    golden.rows[1].outcome.update(status="oom", iteration=3, phase=None)
    dead = run_record("moe_act", peak=29_400_000_000, status="oom", died_in=3)  # phase "forward"
    assert not {c for c in _failures(golden, path, run_record(), dead) if c[1] == "outcome"}
    golden.rows[1].outcome["phase"] = "backward"
    assert ("moe_act", "outcome", "FAIL: failure stage changed") in _failures(
        golden, path, run_record(), dead
    )


def test_effects_need_a_control_in_the_golden_and_in_the_records(tmp_path, capsys):
    golden, path = _effect_golden(tmp_path)
    with pytest.raises(UsageError, match="has no \\[\\] control row"):
        validate_golden({**golden.to_json(), "rows": [golden.to_json()["rows"][1]]}, "g")
    with pytest.raises(UsageError, match="these records have none"):
        compare_records(golden, [run_record("moe_act", peak=29_400_000_000, step_ms=408.0)], path)
    for bad in (-1.0, "x", float("nan")):
        data = golden.to_json()
        data["tolerance"]["step_time_cost_pct"]["abs"] = bad
        with pytest.raises(UsageError, match="tolerance.step_time_cost_pct.abs"):
            validate_golden(data, "g")
    capsys.readouterr()
    assert (
        main(["compare", "--golden", path, *write_records(tmp_path / "w", run_record("moe_act"))])
        == 2
    )
    assert capsys.readouterr().err.count("\n") == 1


def test_peak_scope_is_part_of_the_identity(tmp_path):
    golden, path = _effect_golden(tmp_path)
    golden.peak_scope = "rank0"  # rank 0 is the hottest rank in these records: same numbers
    assert compare_records(
        golden, [run_record(), run_record("moe_act", peak=29_400_000_000, step_ms=408.0)], path
    ).passed
    golden.peak_scope = "dp-rank0"  # data-parallel rank 0 is rank 0 alone here (dp = 2)
    assert compare_records(
        golden, [run_record(), run_record("moe_act", peak=29_400_000_000, step_ms=408.0)], path
    ).passed
    reference = run_json()
    reference["metrics"]["ranks"] = []
    reference["metrics"]["headline"]["peak_scope"] = "all-ranks"
    with pytest.raises(UsageError, match="cannot give the 'dp-rank0' peak"):
        golden_values_of(Record.from_json(reference), "dp-rank0")


def test_a_golden_pinned_by_commit_and_sources_matches_either(tmp_path, capsys):
    # Bridge's submodule reports a commit; a wheel of the same sources only version + fingerprint.
    both = copy.deepcopy(REVISIONS)
    both["megatron_core"]["commit"] = "24bad8e677d22625d86ef2a54c9506b6e4992c93"
    assert refresh(tmp_path, run_record(revisions=both)) == 0
    (path,) = (tmp_path / "golden").glob("*.json")
    golden = load_golden(path)
    assert golden.pins["megatron_core"] == both["megatron_core"]
    wheel = copy.deepcopy(both)
    wheel["megatron_core"]["commit"] = None
    patched = copy.deepcopy(both)
    patched["megatron_core"]["fingerprint"] = (
        "0123456789abcdef"  # same commit, local edit elsewhere
    )
    for revisions in (wheel, patched):
        assert compare_records(golden, [run_record(revisions=revisions)], str(path)).passed
    other = copy.deepcopy(wheel)
    other["megatron_core"]["fingerprint"] = "0123456789abcdef"
    with pytest.raises(
        UsageError,
        match="megatron_core.commit 24bad8e6.* != None.*megatron_core.fingerprint feedfacecafebeef != 0123456789abcdef",
    ):
        compare_records(golden, [run_record(revisions=other)], str(path))
