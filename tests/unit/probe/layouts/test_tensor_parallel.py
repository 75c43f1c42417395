"""The TP probe (harness.probe.layouts.tensor_parallel): dense-tiny's rows on both ranks of a real two-rank
torchrun TP group on gloo with sequence parallel, judged against the golden ``probe --model
dense-tiny --tensor-parallel 2 --write-golden`` wrote. Expected values are relations between
measurements or read from harness-written goldens."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from harness.cli import main
from harness.golden.probe import probe_records, recipe_name
from harness.golden.store import CHECKOUT_ROOT, CPU_SUBDIR, golden_filename, load_golden
from harness.probe.present.axes import MEASURED, coverage
from harness.probe.runner import ModelProbe

# One two-rank torchrun probe of dense-tiny's rows, fp32: .ci/run's "layouts" step.
pytestmark = [pytest.mark.slow, pytest.mark.layouts]

MODEL, TP = "dense-tiny", 2


@pytest.fixture(scope="module")
def run() -> tuple[int, ModelProbe, str]:
    """``probe --model dense-tiny --tensor-parallel 2 --precision fp32 --check-golden --json``: its
    exit code, the probe every rank agreed on (the JSON on stdout) and the golden verdict lines (on
    stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["probe", "--model", MODEL, "--tensor-parallel", str(TP), "--precision", "fp32"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--check-golden", "--json"])
    (found,) = json.loads(out.getvalue())
    return code, ModelProbe.from_dict(found), err.getvalue()


def test_the_ranks_agree_and_match_the_golden(run):
    # Exit 0: both ranks measured every row alike (a disagreement fails the probe) and the values
    # match the golden, carried bytes and per-phase / per-module peaks included.
    code, probe, verdicts = run
    assert code == 0, verdicts
    assert probe.tensor_parallel == TP
    assert f"matches {recipe_name(MODEL, tensor_parallel=TP)}__" in verdicts


def test_the_same_rows_are_measured_as_on_one_process(run):
    # The labels the validator accepts do not depend on TP (one process's harness-written golden
    # holds its measured rows); under SP each rank retains less than the whole model does.
    _, probe, _ = run
    record = probe_records(probe)[0]
    single = load_golden(
        CHECKOUT_ROOT
        / CPU_SUBDIR
        / golden_filename(recipe_name(MODEL), record.hardware.profile(), record.pins())
    )
    whole = {row.label: row.values for row in single.rows}
    assert {row.label for row in probe.rows if row.measured} == set(whole)
    for row in probe.rows:
        if row.measured:
            assert row.retained_bytes < whole[row.label]["retained_bytes"], row.label


def test_coverage_lists_tp2_with_sequence_parallel_as_measured(run):
    _, probe, _ = run
    axes = {(entry["axis"], entry["value"]): entry for entry in coverage([probe])["axes"]}
    tp2 = axes[("tensor parallel", "TP 2 + sequence parallel")]
    assert tp2["status"] == MEASURED
    assert tp2["where"] == [f"{MODEL} (fp32, unfused, TP 2 + SP)"]
