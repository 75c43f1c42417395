"""A row or a model that raises is recorded with status ``error`` and its exception line; the rest of
the probe goes on, the command exits 1 and writes no golden missing those rows."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state
from harness.golden.probe import golden_step
from harness.probe import runner
from harness.probe.measurement.status import EFFECTIVE, ERROR, REJECTED
from harness.probe.plan import ProbeRow


@pytest.fixture
def core_attn_raises(monkeypatch):
    real = runner.measure_row

    def measure_row(model, row, base, **kwargs):
        if row.label == "core_attn":
            raise RuntimeError("a tree this harness has never seen\nsecond line")
        return real(model, row, base, **kwargs)

    monkeypatch.setattr(runner, "measure_row", measure_row)


def test_a_row_that_raises_is_an_error_row_and_the_others_are_measured(core_attn_raises, tmp_path):
    (probe,) = runner.probe_models(["dense-tiny"], [("core_attn",), ("mlp",)], hang_probe=False)
    rows = {row.label: row for row in probe.rows}
    assert rows["core_attn"].status == ERROR
    assert rows["core_attn"].reason == "RuntimeError: a tree this harness has never seen"
    assert rows["core_attn"].retained_bytes is None
    assert rows["mlp"].status == EFFECTIVE and rows["mlp"].retained_bytes
    assert runner.probe_errors([probe]) == [
        "dense-tiny / core_attn: RuntimeError: a tree this harness has never seen"
    ]
    step = golden_step([probe], write=True, golden_dir=tmp_path)
    assert step.differs and step.written == [] and not list(tmp_path.rglob("*.json"))
    assert step.lines()[0] == "dense-tiny: not written: 1 row(s) raised (core_attn)"


def test_a_model_whose_control_raises_records_every_row_as_error(monkeypatch):
    def baseline(model, **kwargs):
        raise ImportError("No module named 'megatron.core.transformer.moe.moe_logging'")

    monkeypatch.setattr(runner, "baseline", baseline)
    (probe,) = runner.probe_models(["dense-tiny"], [("mlp",)], hang_probe=False)
    assert {row.status for row in probe.rows} == {ERROR}
    assert probe.rows[0].reason == (
        "the [] control raised ImportError: No module named 'megatron.core.transformer.moe.moe_logging'"
    )


def test_probe_exits_1_naming_each_row_that_raised(core_attn_raises, tmp_path, capsys):
    argv = ["probe", "--model", "dense-tiny", "--modules", "core_attn", "mlp", "--jobs", "1"]
    argv += ["--details"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    # The bf16 pass runs the same rows: each raising row is named with its pass.
    assert "2 row(s) raised (status error; the rest was probed):" in out
    assert "  dense-tiny / core_attn: RuntimeError: a tree this harness has never seen\n" in out
    assert (
        "  dense-tiny (bf16) / core_attn: RuntimeError: a tree this harness has never seen\n" in out
    )
    assert "exercised by none of dense-tiny\n" in out


def test_a_run_time_check_of_megatron_core_is_a_rejection_not_an_error():
    # 0.19.2's MTP layer asserts recompute_num_layers == 1 under uniform full recompute in its
    # forward: the validator accepted the configuration, Megatron Core refused it at first use.
    init_cpu_parallel_state(seed=1234)
    base = runner.baseline("mtp-tiny")
    row = runner.measure_row("mtp-tiny", ProbeRow(RecomputeFields.full("uniform", 2)), base)
    assert (row.status, row.rule) == (REJECTED, "mcore.unclassified")
    assert row.reason == (
        "accepted by the validator, refused at the first forward: "
        "AssertionError: recompute_num_layers must be 1 for MTP recompute"
    )


def test_an_assertion_outside_megatron_core_is_still_an_error(monkeypatch):
    init_cpu_parallel_state(seed=1234)
    base = runner.baseline("dense-tiny")

    def measure(model, **kwargs):
        raise AssertionError("the harness's own assertion")

    monkeypatch.setattr(runner, "measure", measure)
    row = runner.measure_row("dense-tiny", ProbeRow(RecomputeFields.selective("mlp")), base)
    assert row.status == ERROR and row.reason.startswith("AssertionError: the harness's own")
