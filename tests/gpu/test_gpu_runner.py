"""GPU tier (nightly, ``pytest -m gpu``): the runner on real GPUs, both back ends, and the seed-study
goldens. Each test skips with the name of what the machine lacks.

Two kinds of sweep, written apart: a *compared* sweep is one of the nightly's cases
(``harness.golden.nightly.NIGHTLY_CASES``, the one list ci/nightly-gpu.sh and ci/golden-refresh.sh
read too): it runs its recipe's full row set and is judged, inside the test and again by
ci/nightly-gpu.sh, against the golden of the installed pins (peaks, step time, TFLOP/s), or, for a seed
study on other revisions than the card's, by its effects against the card's golden; no golden is a
failure naming the case, the pins and the refresh command. It lands in ``$RECOMPUTE_HARNESS_GPU_OUT``.
Partial-row and fault-injection sweeps measure what no golden holds; they land in its ``scratch/``,
which the nightly's comparison never reads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from gates import require

from harness.golden.nightly import NIGHTLY_CASES, golden_for, installed_pins, judge
from harness.golden.store import golden_root
from harness.record.io import load_records
from harness.run.recipes import Recipe, load_recipe
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


def _needs(recipe: Recipe) -> dict[str, Any]:
    """What a recipe's machine must have (gates.require's keywords)."""
    return {
        "gpus": recipe.world_size,
        "te": "transformer_engine" in recipe.requires,
        "mamba": "mamba_ssm" in recipe.requires,
        "bridge": recipe.backend == "bridge",
    }


@pytest.mark.parametrize("case", NIGHTLY_CASES, ids=lambda case: case.recipe)
def test_nightly_case_matches_its_golden(tmp_path, case):
    recipe = case.loaded
    require(**_needs(recipe), sm="9.0")  # every case's golden is of H100s
    installed = installed_pins()
    # Checked before the GPUs run (an hour, for a full recipe): a night without a golden judges nothing.
    found = golden_for(case, installed, golden_root())
    if found.path is None:
        pytest.fail(found.missing_line(installed), pytrace=False)
    directory, results = run_sweep(recipe, _compared(tmp_path))
    if not case.seed:  # a card study's rows may OOM by design (the card's stages are judged)
        _assert_complete_with_per_rank_peaks(results, recipe.world_size)
    assert len(load_records([directory / "records"])) == len(recipe.rows)
    comparison = judge(found, [result.record for result in results])
    assert comparison.passed, [
        f"{check.label}: {check.metric}: {check.verdict}" for check in comparison.failures
    ]


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


@pytest.mark.parametrize("recipe_name", ["moonlight-short-1gpu", "nemotron-3-nano-short-1gpu"])
def test_bridge_one_gpu_recipes_run_a_row(tmp_path, recipe_name):
    # Smoke runs on one GPU (no golden: the 8-GPU short recipes are the compared cases).
    recipe = load_recipe(recipe_name)
    require(**_needs(recipe))
    _, results = run_sweep(recipe, _scratch(tmp_path), rows=[recipe.rows[1]])
    _assert_complete_with_per_rank_peaks(results, recipe.world_size)
    for result in results:
        # Bridge's environment defaults reached CUDA's start, as in Bridge's own launches, and the record
        # keeps every variable that changes allocator, dispatcher, kernels or graphs.
        extra, environment = result.record.workload.extra, result.record.workload.environment
        assert "env.PYTORCH_CUDA_ALLOC_CONF" in extra and "env_applied_after_cuda_init" not in extra
        assert environment is not None and "PYTORCH_CUDA_ALLOC_CONF" in environment
        assert result.record.hardware.device != "unidentified"
