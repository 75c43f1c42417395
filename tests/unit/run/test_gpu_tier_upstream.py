"""The GPU tier read against upstream (Megatron Bridge 0.6.2, Megatron Core 0.19.2, torch 2.14.1), on CPU:
upstream's own failure texts fed to the classifier, the record path fed per-rank evidence files, and the
pieces of the back ends that need no GPU. Each test names the issue-14 finding it pins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.errors import UsageError
from harness.golden.format import golden_from_records
from harness.golden.judge import compare_records
from harness.record.schema import validate_record
from harness.run.assemble import build_record
from harness.run.classify import Classification, classify
from harness.run.events import EventWriter, events_path, read_rank
from harness.run.faults import parse_fault
from harness.run.instrument import Instrument
from harness.run.preflight import preflight_environment
from harness.run.recipes import Recipe, check_packages, check_recipe, importable, load_recipe
from harness.run.runner import check_launchable
from harness.run.torchrun import TORCHRUN_DIR, LaunchResult

GIB = 1 << 30


def _ranks(tmp_path, world, write):
    """Per-rank evidence files written through the workers' own writer, read back as the runner does."""
    for rank in range(world):
        writer = EventWriter(tmp_path, rank)
        writer.emit("start", rank=rank, world_size=world, pid=100 + rank, device="cuda")
        write(writer, rank)
        writer.close()
    return [read_rank(events_path(tmp_path, rank), rank) for rank in range(world)]


def _classify(ranks, tmp_path, launch=None):
    return classify(
        ranks,
        launch or LaunchResult([1], 5.0, "token"),
        train_iters=6,
        row_dir=tmp_path,
        stall_timeout_s=300,
        timeout_s=1200,
    )


# 14. Megatron Core's rerun state machine (reruns disabled, Bridge's default) raises RuntimeError with this
# text for Bridge's masked_next_token_loss checks (rerun_state_machine.validate_result, losses.py).
@pytest.mark.parametrize(
    "check",
    ["found Inf in local forward loss calculation", "found NaN in local forward loss calculation"],
)
def test_an_inf_loss_is_a_numerical_failure_like_nan(tmp_path, check):
    message = (
        f"Rank 1, node h200-a, device 1, iteration 5: Unexpected result inf (message='{check}')"
    )

    def write(writer, rank):
        writer.emit("phase", iteration=5, phase="forward")
        if rank == 1:
            writer.emit(
                "error",
                iteration=5,
                phase="forward",
                type="RuntimeError",
                message=message,
                local_loss_finite=None,
            )

    outcome = _classify(_ranks(tmp_path, 2, write), tmp_path)
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "nan",
        5,
        "forward",
        (1,),
    )


def test_the_inf_fault_poisons_the_loss_with_inf_on_its_rank_and_iteration(tmp_path, monkeypatch):
    import math

    import torch

    monkeypatch.setenv("RECOMPUTE_HARNESS_FAULT", "inf:iteration=3,rank=1")
    instrument = Instrument(tmp_path, 1, "cpu")
    assert instrument.loss(torch.tensor(2.0), 2).item() == 2.0
    assert math.isinf(instrument.loss(torch.tensor(2.0), 3).item())
    assert read_rank(events_path(tmp_path, 1), 1).fault_fired
    with pytest.raises(UsageError, match="non-finite loss is made in the forward phase"):
        parse_fault("inf:phase=backward")


# 5. torch's NCCL watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, the default) aborts the process: no Python
# error, no torchrun error file, only this line (ProcessGroupNCCL's format) on the rank's stderr.
WATCHDOG_LINE = (
    "[rank0]:[E1201 10:00:00.000000000 ProcessGroupNCCL.cpp:685] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600047 milliseconds before timing out."
)


def test_a_watchdog_abort_is_a_hang_at_the_rank_furthest_behind(tmp_path):
    def write(writer, rank):
        writer.emit("phase", iteration=4, phase="grad-sync" if rank == 0 else "backward")

    ranks = _ranks(tmp_path, 2, write)
    log = tmp_path / TORCHRUN_DIR / "node0" / "job" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("some warning\n" + WATCHDOG_LINE + "\nFatal Python error: Aborted\n")
    outcome = _classify(ranks, tmp_path, LaunchResult([-6], 601.0, "token"))
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "hang",
        4,
        "backward",
        (1,),
    )
    assert "NCCL watchdog" in outcome.message


def test_collectives_outlast_the_stall_timeout():
    from harness.run.backend_bridge import collective_timeout_minutes

    for name in ("moonlight-full-8gpu", "nemotron-3-nano-full-16gpu", "nemotron-3-nano-short-8gpu"):
        recipe = load_recipe(name)
        assert collective_timeout_minutes(recipe) * 60 > recipe.timeout_s > recipe.stall_timeout_s
    values = load_recipe("cpu-moonlight-ep2").as_dict()
    values["stall_timeout_s"] = values["timeout_s"]
    with pytest.raises(UsageError, match="stall_timeout_s 120 must be shorter than timeout_s 120"):
        check_recipe(Recipe.from_dict(values))


# 12. A rank that reported its OOM and then hung in upstream clean-up: the OOM is the outcome.
def test_an_error_line_wins_over_the_runner_stopping_the_row(tmp_path):
    def write(writer, rank):
        writer.emit("phase", iteration=3, phase="backward")
        if rank == 0:
            writer.emit(
                "error",
                iteration=3,
                phase="backward",
                type="OutOfMemoryError",
                message="CUDA out of memory. Tried to allocate 2.00 GiB",
                local_loss_finite=None,
            )

    outcome = _classify(
        _ranks(tmp_path, 2, write), tmp_path, LaunchResult([-15], 310.0, "token", "stall")
    )
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "oom",
        3,
        "backward",
        (0,),
    )
    assert outcome.message.endswith("then the runner stopped the row (stall)")


def test_the_error_line_is_written_before_the_callers_clean_up(tmp_path):
    """Bridge's _pretrain catches, cleans up (may hang), then re-raises: the line must already be there."""
    import torch

    instrument = Instrument(tmp_path, 0, "cpu")
    seen_by_clean_up = []

    def train_loop():
        instrument.enter(3, "backward")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def pretrain_like():
        try:
            train_loop()
        except BaseException:
            seen_by_clean_up.append(read_rank(events_path(tmp_path, 0), 0).errors)
            raise

    with pytest.raises(torch.OutOfMemoryError) as raised:  # noqa: SIM117
        with instrument.reporting_unwind([train_loop]):
            pretrain_like()
    instrument.failed(raised.value)  # the worker reports again at the end: written once
    assert [error["type"] for error in seen_by_clean_up[0]] == ["OutOfMemoryError"]
    assert [
        (e["iteration"], e["phase"]) for e in read_rank(events_path(tmp_path, 0), 0).errors
    ] == [(3, "backward")]
    assert "recompute-harness" not in [
        sys.monitoring.get_tool(i) for i in range(6)
    ]  # the tool slot is freed


# 8. CUDA-graph capture: iteration 3 was emitted at its end; capture (before iteration 4) ran out of memory.
def test_a_capture_oom_is_reported_in_its_own_phase_and_keeps_the_step_before(tmp_path):
    recipe = load_recipe("nemotron-3-nano-short-1gpu")

    def write(writer, rank):
        writer.emit("device", name="NVIDIA H200", sm="9.0")
        for it in (1, 2, 3):
            writer.emit("phase", iteration=it, phase="forward")
            writer.emit(
                "iteration",
                iteration=it,
                loss=9.0,
                step_time_ms=900.0,
                skipped=False,
                allocated_bytes=40 * GIB + it,
                reserved_bytes=50 * GIB,
                device_used_bytes=60 * GIB,
                nan=False,
            )
        writer.emit("phase", iteration=4, phase="cuda-graph-capture")
        writer.emit(
            "error",
            iteration=4,
            phase="cuda-graph-capture",
            type="OutOfMemoryError",
            message="CUDA out of memory. Tried to allocate 8.00 GiB",
            local_loss_finite=None,
        )

    ranks = _ranks(tmp_path, 1, write)
    outcome = _classify(ranks, tmp_path)
    assert (outcome.status, outcome.iteration, outcome.phase) == ("oom", 4, "cuda-graph-capture")
    record = build_record(recipe, "[]", ranks, outcome, revisions=_revisions()).to_json()
    assert [p["iteration"] for p in record["metrics"]["ranks"][0]["peaks"]] == [1, 2, 3]
    assert record["outcome"]["phase"] == "cuda-graph-capture"


def _revisions():
    from harness.config.revisions import collect_revisions

    return collect_revisions()


def _gpu_row(
    tmp_path, recipe, dispatcher="flex/hybridep", attention="fused", times=(1000.0, 1100.0)
):
    """Two ranks of a GPU run as the bridge back end reports it (notes, per-step lines, FLOPs)."""

    def write(writer, rank):
        writer.emit("device", name="NVIDIA H200", sm="9.0")
        writer.emit("note", key="attention_backend", value=attention)
        writer.emit("note", key="moe_dispatcher", value=dispatcher)
        for it in range(1, recipe.train_iters + 1):
            writer.emit(
                "iteration",
                iteration=it,
                loss=5.0,
                step_time_ms=times[rank],
                skipped=False,
                allocated_bytes=(30 + rank) * GIB + it,
                reserved_bytes=40 * GIB,
                device_used_bytes=(45 + rank) * GIB,
                nan=False,
            )
            writer.emit("flops", iteration=it, flops=4.4e15)

    row_dir = tmp_path / f"{dispatcher.replace('/', '-')}-{attention}"
    row_dir.mkdir()
    ranks = _ranks(row_dir, recipe.world_size, write)
    outcome = Classification("completed", recipe.train_iters, None, (), "ok")
    return build_record(recipe, "[]", ranks, outcome, revisions=_revisions())


# 4, 6, 11. One step time for step time and TFLOP/s; every rank's peaks and device memory kept.
def test_step_time_and_tflops_share_one_definition_and_every_rank_is_kept(tmp_path):
    recipe = load_recipe("moonlight-short-2gpu")
    record = _gpu_row(tmp_path, recipe).to_json()
    validate_record(record)
    for row in record["metrics"]["iterations"]:
        assert row["step_time_ms"] == 1100.0  # the slowest rank's interval
        assert row["tflops_per_gpu"] == pytest.approx(4.4e15 / 1.1 / 2 / 1e12)  # the same interval
    ranks = record["metrics"]["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    for rank in ranks:
        assert len(rank["peaks"]) == recipe.train_iters
        assert {peak["device_used_bytes"] for peak in rank["peaks"]} == {(45 + rank["rank"]) * GIB}
    assert record["metrics"]["headline"]["peak_rank"] == 1


# 7. The dispatcher and attention back end the run had are its identity: a fallback is another workload.
def test_a_dispatcher_fallback_is_another_workload_not_a_regression(tmp_path):
    recipe = load_recipe("moonlight-short-2gpu")
    hybrid, fallback = _gpu_row(tmp_path, recipe), _gpu_row(tmp_path, recipe, dispatcher="alltoall")
    assert hybrid.workload.extra["moe_dispatcher"] == "flex/hybridep"
    golden = golden_from_records([hybrid], {"source": "test"})
    assert golden.to_json()["workload"] == {
        "attention_backend": "fused",
        "moe_dispatcher": "flex/hybridep",
    }
    assert compare_records(golden, [hybrid], "g.json").passed
    with pytest.raises(UsageError, match="workload.moe_dispatcher flex/hybridep != alltoall"):
        compare_records(golden, [fallback], "g.json")
    with pytest.raises(UsageError, match="as-run workload"):
        golden_from_records([hybrid, fallback], {"source": "test"})
    flash = _gpu_row(tmp_path, recipe, attention="flash")
    assert (
        flash.workload.attention_backend,
        flash.workload.extra["attention_backend_requested"],
    ) == ("flash", "fused")


# 9. A fault the back end never fires is refused before launch.
@pytest.mark.parametrize(
    "spec",
    [
        "oom:iteration=2,phase=backward",
        "oom:iteration=2,phase=grad-sync",
        "hang:iteration=3,phase=optimizer-step",
    ],
)
def test_bridge_refuses_faults_in_phases_it_never_marks(spec):
    with pytest.raises(UsageError, match="the bridge back end never marks phase"):
        check_launchable(load_recipe("moonlight-short-1gpu"), [parse_fault(spec)])


def test_mcore_refuses_a_capture_fault():
    with pytest.raises(UsageError, match="the mcore back end never marks phase cuda-graph-capture"):
        check_launchable(
            load_recipe("cpu-moonlight-ep2"),
            [parse_fault("oom:iteration=2,phase=cuda-graph-capture")],
        )


# 1. The pre-launch check validates on the GPUs the workers will use.
def test_preflight_child_sees_the_workers_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    env = preflight_environment(load_recipe("nemotron-3-nano-short-8gpu"))
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "8")


# 3. Bridge's pretrain imports nvidia_resiliency_ext.inprocess on every rank.
@pytest.mark.skipif(
    importable("nvidia_resiliency_ext.inprocess"), reason="nvidia-resiliency-ext is installed here"
)
def test_a_bridge_recipe_needs_nvidia_resiliency_ext():
    with pytest.raises(
        UsageError, match=r"needs .*nvidia_resiliency_ext\.inprocess.* not installed"
    ) as refused:
        check_packages(load_recipe("moonlight-short-1gpu"))
    assert "\n" not in str(refused.value)


# 13. The allocator fixes its settings at the first read, CUDA or not: only its own answer tells.
ALLOCATOR_PROGRAM = """
import os, sys, torch
from harness.run.allocator import allocator_settings, ignored_allocator_env
if sys.argv[1] == "read-first":
    allocator_settings()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
print(torch.cuda.is_initialized(), ignored_allocator_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
"""


@pytest.mark.parametrize(
    "order, expected", [("apply-first", "False None"), ("read-first", "False PYTORCH_CUDA")]
)
def test_the_allocator_settings_are_checked_not_cuda_init(order, expected):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    }
    out = subprocess.run(
        [sys.executable, "-c", ALLOCATOR_PROGRAM, order],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert out.startswith(expected), out
