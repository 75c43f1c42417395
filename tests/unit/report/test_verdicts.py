"""The verdict blocks of ``diff`` and ``estimate --check-golden``: PASS or FAIL in words, the first
change named (harness.report.verdicts)."""

from __future__ import annotations

from pathlib import Path

from harness.compare.tree_diff import TreeDiff
from harness.golden.figures import FigureMismatch
from harness.record.changes import ValueChange
from harness.report.verdicts import diff_summary, estimate_summary


def _side(version: str, fingerprint: str) -> dict:
    identity = {"version": version, "commit": None, "fingerprint": fingerprint, "root": "/x"}
    return {
        "identity": identity,
        "probes": [{"model": "dense-tiny", "precision": "fp32", "attention_backend": "unfused"}],
        "adapter_drift": [],
    }


def test_a_new_fingerprint_with_no_value_changed_is_same_behaviour():
    found = TreeDiff((_side("0.19.2", "a" * 16), _side("0.19.2", "b" * 16)))
    summary = diff_summary(found, wall_s=3.0)
    assert summary.passed
    assert (
        summary.lines()[0]
        == "== diff: A megatron-core 0.19.2 (aaaaaaaaaaaa) -> B megatron-core 0.19.2 (bbbbbbbbbbbb)"
    )
    assert summary.lines()[-1] == "PASS: same behaviour (new fingerprint, no value changed); 3 s"


def test_a_changed_tree_names_the_first_change_labels_before_values():
    found = TreeDiff(
        (_side("0.19.2", "a" * 16), _side("0.20.0", "b" * 16)),
        labels_added=["mhc"],
        changes=[ValueChange("dense-tiny", "dense-tiny", "layernorm", "retained_bytes", 100, 120)],
    )
    lines = diff_summary(found, wall_s=1.0).lines()
    assert "labels     +mhc" in lines
    assert "values     1 changed" in lines
    # The first changed value, then what became of its label.
    assert "           first: dense-tiny: layernorm: retained_bytes 100 -> 120" in lines
    assert "changed    layernorm: saves less on dense-tiny (retained +20 %)" in lines
    assert lines[-1] == "FAIL: behaviour changed; first: label mhc added; 1 s"


def test_a_changed_value_alone_is_the_first_change():
    found = TreeDiff(
        (_side("0.19.2", "a" * 16), _side("0.19.2", "b" * 16)),
        changes=[
            ValueChange("dense-tiny", "dense-tiny", "core_attn", "replay_bytes", 2565644, 0),
            ValueChange("dense-tiny", "dense-tiny", "core_attn", "status", "effective", "inactive"),
        ],
    )
    lines = diff_summary(found, wall_s=1.0).lines()
    assert lines[-1] == (
        "FAIL: behaviour changed; first: dense-tiny: core_attn: replay_bytes 2565644 -> 0; 1 s"
    )
    assert "changed    core_attn: inactive on dense-tiny (replayed 2.6 MB -> 0)" in lines


def test_an_estimate_golden_mismatch_is_named():
    mismatch = FigureMismatch("row 'moe'", "saving_bytes", 100, 90)
    summary = estimate_summary("moonlight-full-8gpu", Path("g.json"), [mismatch], rows=3, wall_s=2)
    assert not summary.passed
    assert summary.lines()[-1].startswith(
        "FAIL: 1 figure(s) differ; first: row 'moe': saving_bytes"
    )


def test_an_estimate_golden_mismatch_says_each_row_once_with_its_figures():
    mismatches = [
        FigureMismatch("row 'moe'", "saving_bytes", 100, 90),
        FigureMismatch("row 'moe'", "retained_bytes", 200, 206),
        FigureMismatch("row 'core_attn'", "status", "effective", "inactive"),
    ]
    lines = estimate_summary("r", Path("g.json"), mismatches, rows=3, wall_s=2).lines()
    assert "           first: row 'moe': saving_bytes golden 100, now 90 (-10.00 %)" in lines
    assert "changed    row 'moe': saving_bytes -10 %, retained_bytes +3 %" in lines
    assert "           row 'core_attn': status 'effective' -> 'inactive'" in lines


def test_a_capacity_golden_mismatch_says_each_row_once_with_its_figures():
    from harness.report.verdicts import plan_summary

    result = {"rows": [{"label": "moe", "fits": True, "status": "fits"}], "chosen": "moe"}
    result["budget_bytes"] = 80e9
    mismatch = FigureMismatch("row 'moe'", "peak_bytes", 1000, 1100)
    lines = plan_summary(
        "w",
        result,
        command="plan",
        wall_s=1.0,
        golden_line="1 figure(s) differ",
        mismatches=[mismatch],
    ).lines()
    assert "changed    row 'moe': peak_bytes +10 %" in lines
