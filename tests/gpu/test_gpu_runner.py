"""GPU tier (nightly, ``pytest -m gpu``): the runner on real GPUs, both back ends, and the seed-study
goldens. Each test skips with the name of what the machine lacks.

Two kinds of sweep, written apart: a *compared* sweep (a case of harness/run/nightly.py) runs its
recipe's full row set and is judged, inside the test and again by ci/nightly-gpu.sh, against the
golden of its own pins (peaks, step time, TFLOP/s; no golden is a failure naming the case, the pins
and the refresh command; a seed study on other pins is judged on effects); it lands in
``$RECOMPUTE_HARNESS_GPU_OUT``.
Partial-row and fault-injection sweeps measure what no golden holds; they land in its ``scratch/``,
which the nightly's comparison never reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gates import require

from harness.golden.judge import compare_effects, compare_records
from harness.record.io import load_records
from harness.report.markdown import comparison_markdown
from harness.run.nightly import (
    NIGHTLY_CASES,
    golden_for,
    installed_pins,
    missing_golden_line,
    seed_golden,
)
from harness.run.recipes import load_recipe
from harness.run.runner import run_sweep

pytestmark = pytest.mark.gpu


def _compared(tmp_path: Path) -> Path:
    """Where a full-recipe sweep goes: ci/nightly-gpu.sh compares every sweep directly under it."""
    return Path(os.environ.get("RECOMPUTE_HARNESS_GPU_OUT", tmp_path))


def _scratch(tmp_path: Path) -> Path:
    """Where partial and fault sweeps go: kept for the report, never compared with a golden."""
    return _compared(tmp_path) / "scratch"


def _assert_complete_with_per_rank_peaks(results, world_size: int) -> None:
    for result in results:
        assert result.outcome.status == "completed", f"{result.row}: {result.outcome.message}"
        ranks = result.record.run_metrics.ranks
        assert sorted(rank.rank for rank in ranks) == list(range(world_size))
        for rank in ranks:
            for peak in rank.peaks:
                assert 0 < peak.allocated_bytes <= peak.reserved_bytes
        headline = result.record.headline
        assert headline["peak_after_iteration"] == 2 and headline["step_time_ms"] > 0
        assert headline["run_peak_allocated_bytes"] >= headline["peak_allocated_bytes"]
        assert result.record.run_metrics.nan_iterations == 0


@pytest.mark.parametrize("case", NIGHTLY_CASES, ids=lambda case: case.recipe)
def test_nightly_case_matches_its_golden(tmp_path, case):
    """Every case of the one list (harness/run/nightly.py): the whole recipe, judged against the golden
    of the installed stack's exact pins; a seed study on other pins against its card golden, by
    effects. A case without a golden fails in one line before the GPUs run."""
    require(**case.needs)
    pins = installed_pins()
    exact = golden_for(case, pins)
    seed = seed_golden(case) if exact is None and case.seed_study else None
    if exact is None and seed is None:
        pytest.fail(missing_golden_line(case, pins), pytrace=False)
    recipe = load_recipe(case.recipe)
    directory, results = run_sweep(recipe, _compared(tmp_path))
    assert len(load_records([directory / "records"])) == len(recipe.rows)
    records = [result.record for result in results]
    if exact is not None:
        comparison = compare_records(exact[1], records, str(exact[0]))
    else:
        assert seed is not None
        comparison = compare_effects(seed[1], records, str(seed[0]))
    assert comparison.passed, comparison_markdown(comparison)


def test_injected_oom_on_gpu_is_classified(tmp_path):
    require(gpus=2)
    from harness.run.faults import parse_fault

    _, (result,) = run_sweep(
        load_recipe("mcore-moonlight-2gpu"),
        _scratch(tmp_path),
        rows=[],
        faults=[parse_fault("oom:iteration=3,phase=optimizer-step,rank=1")],
    )
    assert (result.outcome.status, result.outcome.iteration, result.outcome.phase) == (
        "oom",
        3,
        "optimizer-step",
    )


@pytest.mark.parametrize(
    "recipe_name, needs",
    [
        ("moonlight-short-1gpu", {"gpus": 1, "te": True, "bridge": True}),
        ("nemotron-3-nano-short-1gpu", {"gpus": 1, "te": True, "mamba": True, "bridge": True}),
    ],
)
def test_bridge_short_recipes(tmp_path, recipe_name, needs):
    require(**needs)
    recipe = load_recipe(recipe_name)
    _, results = run_sweep(recipe, _scratch(tmp_path), rows=[recipe.rows[1]])
    _assert_complete_with_per_rank_peaks(results, recipe.world_size)
    for (
        result
    ) in results:  # Bridge's environment defaults reached CUDA's start, as in Bridge's own launches
        extra = result.record.workload.extra
        assert "env.PYTORCH_CUDA_ALLOC_CONF" in extra and "env_applied_after_cuda_init" not in extra
        assert result.record.hardware.device != "unidentified"
