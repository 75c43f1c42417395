"""The runner's whole path on CPU: real torchrun, real gloo, real Megatron Core (mcore back end with
the CPU adapter), real records — 2 ranks with expert parallel 2 (the 2-node c10d rendezvous on localhost runs in
test_container_stack.py). Fault-injection runs live in test_faults.py."""

from __future__ import annotations

import copy
import json
import math
import os
import time

import pytest

from harness.compare.analysis import analyse
from harness.errors import UsageError
from harness.golden.format import golden_from_records
from harness.golden.judge import compare_records
from harness.record.io import load_records
from harness.report.sweep import sweep_report, sweep_report_json
from harness.run.environment import declared_environment
from harness.run.recipes import load_recipe
from harness.run.runner import run_sweep
from harness.run.torchrun import processes_with_token

# One two-rank EP 2 torchrun sweep (~20 s of CPU) that every test here reads: .ci/run's "layouts" step.
pytestmark = [pytest.mark.slow, pytest.mark.layouts]


@pytest.fixture(scope="module")
def ep2_sweep(tmp_path_factory):
    recipe = load_recipe("cpu-moonlight-ep2")
    started = time.monotonic()
    directory, results = run_sweep(recipe, tmp_path_factory.mktemp("sweep"))
    return recipe, directory, results, time.monotonic() - started


def test_two_rank_ep2_sweep_completes_and_keeps_every_ranks_evidence(ep2_sweep):
    recipe, _directory, results, elapsed = ep2_sweep
    print(f"cpu-moonlight-ep2 sweep: {len(results)} rows in {elapsed:.1f} s")
    assert [r.row for r in results] == ["[]", "mla_up_proj", "moe_act"]
    for result in results:
        assert result.outcome.status == "completed", result.outcome.message
        record = result.record
        assert record.workload.parallelism.to_json() == {
            "tp": 1,
            "pp": 1,
            "cp": 1,
            "ep": 2,
            "dp": 2,
            "expert_dp": 1,
            "vpp": None,
        }
        iterations = record.run_metrics.iterations
        assert [row.iteration for row in iterations] == list(range(1, recipe.train_iters + 1))
        assert all(math.isfinite(row.loss) and row.step_time_ms > 0 for row in iterations)
        # CPU: no allocator peak is invented; the record says why.
        assert record.run_metrics.ranks == [] and record.headline.peak_scope == "unreported"
        assert "no caching-allocator peak" in record.workload.extra["device_memory"]
        assert (
            record.workload.extra["torch_compile"] == "disabled"
        )  # CPU workers run compiled helpers eagerly
        # Each rank ran with exactly the row's declared environment (spec.json), and the record keeps it.
        declared = json.loads((result.row_dir / "spec.json").read_text())["environment"]
        assert record.workload.environment == declared == declared_environment(os.environ)
        for rank in (0, 1):
            assert (result.row_dir / "events" / f"rank{rank}.jsonl").stat().st_size > 0
            logs = list(result.row_dir.glob(f"torchrun/node0/*/attempt_0/{rank}/stderr.log"))
            assert len(logs) == 1 and "Traceback" not in logs[0].read_text()
        assert processes_with_token(result.launch.token) == []
    # the [] control and the recompute rows saw the same batches: the same first-step loss (moe_act:
    # TEGroupedMLP on the CPU adapter's grouped-linear stand-ins, two local experts per rank)
    first = [r.record.run_metrics.iterations[0].loss for r in results]
    assert all(loss == pytest.approx(first[0], rel=1e-5) for loss in first[1:])


def test_records_feed_the_analysis_and_the_comparator(ep2_sweep, tmp_path):
    _, directory, _results, _ = ep2_sweep
    records = load_records([directory / "records"])
    assert [record.label for record in records] == ["[]", "mla_up_proj", "moe_act"]
    analysis = analyse(records)
    assert analysis.control == "[]" and {row.verdict for row in analysis.rows} == {
        "control",
        "pass",
    }
    # A CPU sweep has no device peaks: the plot shows the step-time cost it does have.
    from harness.report.plot import nothing_to_plot, plot_analysis

    assert nothing_to_plot(analysis) is None and plot_analysis(analysis, tmp_path / "cpu.png") == []
    assert (tmp_path / "cpu.png").stat().st_size > 5_000
    golden = golden_from_records(records, {"source": "test run"})
    assert compare_records(golden, records, "golden.json").passed
    regressed = copy.deepcopy(records[1])
    regressed.run_metrics.nan_iterations = 1
    assert not compare_records(golden, [records[0], regressed], "golden.json").passed


def test_the_report_keeps_a_plot_that_cannot_be_drawn_or_written_as_a_reason(ep2_sweep, tmp_path):
    _, _, results, _ = ep2_sweep
    # A write that fails, as on a disk that filled as the sweep ended: the analysis is still there,
    # the failure is kept for the command to raise after printing it.
    (tmp_path / "analysis.png").mkdir()
    report = sweep_report(tmp_path, results)
    assert report.plot is None and report.why_not == "could not be written"
    assert isinstance(report.unwritten, UsageError) and "is a directory" in str(report.unwritten)
    assert [row.label for row in report.analysis.rows] == ["[]", "mla_up_proj", "moe_act"]
    # Nothing to compare the control with: no plot, no directory made for one.
    control_only = sweep_report(tmp_path / "control-only", results[:1])
    data = sweep_report_json(control_only)
    assert data["plot"] is None and [row["row"] for row in data["rows"]] == ["[]"]
    assert control_only.unwritten is None and not (tmp_path / "control-only").exists()
    assert control_only.why_not == "only the [] control was measured: nothing to compare it with"
