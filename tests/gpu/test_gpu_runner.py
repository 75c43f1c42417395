"""GPU tier (nightly, ``pytest -m gpu``): the runner on real GPUs, both back ends, and the seed-study
goldens. Each test skips with the name of what the machine lacks.

Two kinds of sweep, written apart: a *compared* sweep runs its recipe's full row set and is judged,
inside the test and again by ci/nightly-gpu.sh, against the golden of its own pins (peaks, step time,
TFLOP/s; no golden is a failure naming the file expected); it lands in ``$RECOMPUTE_HARNESS_GPU_OUT``.
Partial-row and fault-injection sweeps measure what no golden holds; they land in its ``scratch/``,
which the nightly's comparison never reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gates import require

from harness.record.io import load_records
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


def test_mcore_backend_one_gpu(tmp_path, recompute_golden):
    require(gpus=1)
    recipe = load_recipe("mcore-moonlight-1gpu")
    directory, results = run_sweep(recipe, _compared(tmp_path))
    _assert_complete_with_per_rank_peaks(results, 1)
    assert len(load_records([directory / "records"])) == len(recipe.rows)
    recompute_golden.check([result.record for result in results])  # peaks, step time, TFLOP/s


def test_mcore_backend_expert_parallel_two_gpus(tmp_path, recompute_golden):
    require(gpus=2)
    _, results = run_sweep(load_recipe("mcore-moonlight-2gpu"), _compared(tmp_path))
    _assert_complete_with_per_rank_peaks(results, 2)
    recompute_golden.check([result.record for result in results])  # peaks, step time, TFLOP/s


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
        ("moonlight-short-8gpu", {"gpus": 8, "te": True, "bridge": True}),
        ("nemotron-3-nano-short-1gpu", {"gpus": 1, "te": True, "mamba": True, "bridge": True}),
        ("nemotron-3-nano-short-8gpu", {"gpus": 8, "te": True, "mamba": True, "bridge": True}),
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


def test_moonlight_seed_study_matches_its_golden(tmp_path):
    require(gpus=8, sm="9.0", te=True, bridge=True)
    from harness.config.revisions import collect_revisions
    from harness.golden.format import pins_differences
    from harness.golden.judge import compare_records
    from harness.golden.store import golden_root, goldens_of
    from harness.record.model import Revisions

    # Several pins can hold a golden for this recipe (a refresh adds one per bump): the seed values hold
    # only where the installed stack matches a golden's pins (the commit, or version + source fingerprint).
    installed = Revisions.from_json(collect_revisions()).pins()
    candidates = goldens_of(
        "moonlight-full-8gpu", {"device": "H100_80GB", "gpu_count": 8}, golden_root()
    )
    matching = [
        (path, golden) for path, golden in candidates if not pins_differences(golden, installed)
    ]
    if (
        not matching
    ):  # checked before 8 GPUs run for an hour: a night without a golden judges nothing
        pinned = sorted(str(golden.pins["megatron_core"]) for _, golden in candidates)
        pytest.fail(
            f"no moonlight-full-8gpu golden pinned to the installed stack {installed['megatron_core']}, "
            f"bridge {installed['megatron_bridge']}; pinned: {pinned} (write one with "
            "ci/golden-refresh.sh)",
            pytrace=False,
        )
    ((golden_path, golden),) = matching
    _, results = run_sweep(load_recipe("moonlight-full-8gpu"), _compared(tmp_path))
    comparison = compare_records(golden, [r.record for r in results], str(golden_path))
    assert comparison.passed, [check.verdict for check in comparison.failures]
