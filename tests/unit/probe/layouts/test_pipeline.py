"""The pipeline probe (harness.probe.layouts.pipeline): dense-deep on two stages, each a real torchrun rank on
gloo running Megatron Core's own 1F1B schedule, judged against the goldens ``probe --model dense-deep
--pipeline-parallel 2 --write-golden`` wrote. Expected values are relations between measurements or
read from harness-written goldens."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from harness.cli import main
from harness.golden.probe import probe_records, recipe_name
from harness.golden.store import CHECKOUT_ROOT, CPU_SUBDIR, golden_filename, load_golden
from harness.models import style_model
from harness.probe.layouts.pipeline import PIPELINE_MICROBATCHES, probe_pipeline
from harness.probe.present.axes import MEASURED, NOT_PROBED, coverage
from harness.probe.runner import ModelProbe, ProbeRowResult

# One two-rank torchrun probe of 7 rows per stage (~35 s of CPU): .ci/run's "layouts" step.
pytestmark = [pytest.mark.slow, pytest.mark.layouts]

MODEL, PP = "dense-deep", 2


@pytest.fixture(scope="module")
def run() -> tuple[int, list[ModelProbe], str]:
    """``probe --model dense-deep --pipeline-parallel 2 --precision fp32 --check-golden --json``:
    its exit code, its stages (the JSON on stdout) and the golden verdict lines (on stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["probe", "--model", MODEL, "--pipeline-parallel", str(PP), "--precision", "fp32"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--check-golden", "--json"])
    found = json.loads(out.getvalue())
    return code, [ModelProbe.from_dict(stage) for stage in found], err.getvalue()


@pytest.fixture(scope="module")
def stages(run) -> list[ModelProbe]:
    return run[1]


def _rows(probe: ModelProbe) -> dict[str, ProbeRowResult]:
    return {row.label: row for row in probe.rows}


def test_every_stage_matches_its_golden(run):
    code, stages, verdicts = run
    assert code == 0, verdicts
    assert [probe.stage for probe in stages] == list(range(PP))
    for probe in stages:
        assert (
            f"matches {recipe_name(MODEL, pipeline_parallel=PP, stage=probe.stage)}__" in verdicts
        )


def test_stage_zero_holds_more_than_one_micro_batch_in_flight_the_last_stage_one(stages):
    first, last = stages
    # 1F1B runs PP - stage - 1 warm-up forwards before the first backward: stage 0 holds two
    # micro-batches' activations at once (storages they share, the causal mask, are held once).
    for row in first.rows:
        assert row.inflight_bytes is not None and row.retained_bytes is not None
        assert row.retained_bytes < row.inflight_bytes <= 2 * row.retained_bytes, row.label
    for row in last.rows:
        assert row.inflight_bytes == row.retained_bytes, row.label


def test_recompute_num_layers_applies_per_stage(stages):
    depth = style_model(MODEL).layers // PP  # each stage's layers
    for probe in stages:
        rows = _rows(probe)
        for row in probe.rows:
            assert row.measured and row.values().equivalence.bitwise, (probe.stage, row.label)
        # block 1 checkpoints one of the stage's layers, uniform 1 every one of them.
        assert rows["full-block-1"].retained_bytes > rows["full-uniform-1"].retained_bytes
        # block at the stage's depth checkpoints each layer alone, as uniform 1 does; above the
        # depth it is clamped to the stage, whatever the model's layer count is.
        assert rows[f"full-block-{depth}"].values() == rows["full-uniform-1"].values()
        assert rows[f"full-block-{depth + 1}"].values() == rows[f"full-block-{depth}"].values()
        # uniform at the stage's depth: one chunk, one checkpointed input.
        assert rows[f"full-uniform-{depth}"].retained_bytes < rows["full-uniform-1"].retained_bytes


def test_block_per_stage_costs_what_block_times_stages_costs_on_one_stage(stages):
    # block n on each of PP stages checkpoints n * PP layers in all: per micro-batch, the stages'
    # backward FLOPs add up to the single-stage probe's for block n * PP (its harness-written golden).
    record = probe_records(stages[0])[0]
    single = load_golden(
        CHECKOUT_ROOT
        / CPU_SUBDIR
        / golden_filename(recipe_name(MODEL), record.hardware.profile(), record.pins())
    )
    whole = {row.label: row.values for row in single.rows}
    depth = style_model(MODEL).layers // PP
    for n in range(1, depth + 1):
        total = sum(_rows(probe)[f"full-block-{n}"].backward_flops or 0 for probe in stages)
        assert total == PIPELINE_MICROBATCHES * whole[f"full-block-{n * PP}"]["backward_flops"]
    control = sum(probe.control.backward_flops or 0 for probe in stages)
    assert control == PIPELINE_MICROBATCHES * whole["[]"]["backward_flops"]


def test_coverage_lists_pp2_as_measured_per_stage(stages):
    axes = {(entry["axis"], entry["value"]): entry for entry in coverage(stages)["axes"]}
    pp2 = axes[("pipeline parallel", "PP 2")]
    assert pp2["status"] == MEASURED
    assert pp2["where"] == [f"{MODEL} (fp32, unfused, PP 2 stage {stage})" for stage in range(PP)]
    assert axes[("pipeline parallel", "PP 1")]["status"] == NOT_PROBED


def test_a_pipeline_past_its_timeout_is_killed_and_named():
    # Real ranks, stopped mid-start-up: the process tree is killed and the probe says which ran over.
    with pytest.raises(RuntimeError, match=r"^hang: the PP 2 probe of dense-deep .* ran past 1 s"):
        probe_pipeline(MODEL, PP, timeout_s=1.0)
