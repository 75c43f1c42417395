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
from harness.record.model import validate_record
from harness.run.assemble import build_record
from harness.run.classify import Classification, classify
from harness.run.events import EventWriter, events_path, read_rank
from harness.run.faults import parse_fault
from harness.run.instrument import Instrument
from harness.run.preflight import preflight_environment
from harness.run.recipes import (
    Recipe,
    check_packages,
    check_recipe,
    importable,
    load_recipe,
    recipe_names,
)
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


# Issue 24 item 4: the waiting rank's watchdog aborts it (SIGABRT) while its stuck peer lives on, so the
# runner sees the waiting rank die unreported first (launch.died) and torchrun names it the root cause.
# The stderr lines are torch 2.14.1's (strings of libtorch_cuda.so, ProcessGroupNCCL); the launcher log
# is torchrun's failure summary for a signal death (torch/distributed/elastic/multiprocessing/errors).
WATCHDOG_ABORT_STDERR = (
    WATCHDOG_LINE
    + "\n[rank0]:[E1201 10:00:00.100000000 ProcessGroupNCCL.cpp:2280] [PG ID 0 PG GUID 0(default_pg) "
    "Rank 0]  failure detected by watchdog at work sequence id: 812 PG status: last enqueued work: "
    "812, last completed work: 811\n"
    "[rank0]:[E1201 10:00:00.100000000 ProcessGroupNCCL.cpp:746] [Rank 0] To avoid data "
    "inconsistency, we are taking the entire process down.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    "Fatal Python error: Aborted\n"
)
TORCHRUN_SIGABRT_SUMMARY = """[E1201 10:00:01.000000 4200 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -6) local_rank: 0 (pid: 4242) of binary: python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
harness.run.worker FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_10:00:01
  host      : h200-a
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4242
============================================================
"""


def test_a_watchdog_abort_seen_as_a_death_blames_the_stuck_peer_not_the_waiting_rank(tmp_path):
    def write(writer, rank):
        writer.emit("phase", iteration=4, phase="grad-sync" if rank == 0 else "backward")

    ranks = _ranks(tmp_path, 2, write)
    log = tmp_path / TORCHRUN_DIR / "node0" / "job" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("some warning\n" + WATCHDOG_ABORT_STDERR)
    (tmp_path / "launcher0.log").write_text(TORCHRUN_SIGABRT_SUMMARY)
    launch = LaunchResult([1], 601.0, "token", stopped="died", died=[0])
    outcome = _classify(ranks, tmp_path, launch)
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "hang",
        4,
        "backward",
        (1,),
    )
    assert "NCCL watchdog aborted 1 waiting rank(s)" in outcome.message


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


# 9 / issue 24 item 4: the bridge back end marks backward, grad-sync and the optimizer (wrapping what
# Bridge's train_step calls), so a fault there is accepted and fires in its own phase.
@pytest.mark.parametrize(
    "spec, phase",
    [
        ("oom:iteration=2,phase=grad-sync", "grad-sync"),
        ("oom:iteration=2,phase=optimizer-step", "optimizer-step"),
    ],
)
def test_a_fault_in_grad_sync_or_the_optimizer_fires_in_that_phase(
    tmp_path, monkeypatch, spec, phase
):
    import torch

    from harness.run.backend_bridge import marking

    parse_fault(spec).check_backend("bridge")  # no longer refused before launch
    monkeypatch.setenv("RECOMPUTE_HARNESS_FAULT", spec)
    instrument = Instrument(tmp_path, 0, "cpu")
    called = []
    step = marking(lambda: called.append(1), instrument, phase, on_first_iteration="optimizer-init")
    instrument.enter(1, "forward")
    step()  # iteration 1: optimizer-init for the optimizer, the fault waits for iteration 2
    instrument.enter(2, "forward")
    with pytest.raises(torch.OutOfMemoryError, match=f"phase {phase}"):
        step()
    rank = read_rank(events_path(tmp_path, 0), 0)
    assert (rank.iteration, rank.phase, rank.fault_fired, called) == (2, phase, True, [1])


def test_a_fault_in_backward_fires_when_autograd_reaches_the_output(tmp_path, monkeypatch):
    import torch

    from harness.run.backend_bridge import mark_backward

    parse_fault("oom:iteration=3,phase=backward").check_backend("bridge")
    monkeypatch.setenv("RECOMPUTE_HARNESS_FAULT", "oom:iteration=3,phase=backward")
    instrument = Instrument(tmp_path, 0, "cpu")
    weight = torch.ones(4, requires_grad=True)
    instrument.enter(3, "forward")
    output = weight * 2.0
    mark_backward(output, instrument, 3)
    with pytest.raises(torch.OutOfMemoryError, match="phase backward"):
        output.sum().backward()
    rank = read_rank(events_path(tmp_path, 0), 0)
    assert (rank.iteration, rank.phase) == (3, "backward")


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


# Issue 24 item 1. The environment of Bridge r0.6's nemotron_3_nano_pretrain_8gpu_h100_bf16_config
# (recipes/nemotronh/h100/nemotron_3_nano.py at 6124fbe, its HybridEP entries), and the assertion HybridEP's
# buffer set-up raises when the EP group is not a multiple of it (MCore fused_a2a._hybrid_ep_num_nodes).
NEMOTRON_3_NANO_ENV = {
    "CUDA_DEVICE_MAX_CONNECTIONS": 32,
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": 8,
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": 128,
    "NVLINK_DOMAIN_SIZE": 8,
    "USE_MNNVL": 0,
}
HYBRID_EP_ASSERTION = (
    "The number of ranks 1 should be divisible by the number of ranks per NVLink domain 8."
)


@pytest.mark.parametrize(
    "recipe_name, per_domain",
    [
        ("nemotron-3-nano-short-1gpu", 1),
        ("nemotron-3-nano-short-2gpu", 2),
        ("nemotron-3-nano-short-8gpu", 8),
        ("nemotron-3-nano-full-16gpu", 8),
    ],
)
def test_hybrid_ep_ranks_per_nvlink_domain_follow_the_recipes_ep(recipe_name, per_domain):
    from harness.run.backend_bridge import HYBRID_EP_RANKS_ENV, hybrid_ep_environment

    ep = load_recipe(recipe_name).parallelism.ep
    fitted = hybrid_ep_environment(NEMOTRON_3_NANO_ENV, ep)
    assert fitted[HYBRID_EP_RANKS_ENV] == per_domain
    assert ep % fitted[HYBRID_EP_RANKS_ENV] == 0  # HybridEP's own requirement
    assert {k: v for k, v in fitted.items() if k != HYBRID_EP_RANKS_ENV} == {
        k: v for k, v in NEMOTRON_3_NANO_ENV.items() if k != HYBRID_EP_RANKS_ENV
    }


@pytest.mark.parametrize(
    "backend, tp, ep, installed, reason",
    [
        # One rank in the TP x EP group: refused at the first dispatch, installed or not (defect 2).
        (
            "hybridep",
            1,
            1,
            True,
            "flex/hybridep (its expert-parallel group would be 1 rank: TP x EP = 1)",
        ),
        (
            "deepep",
            1,
            1,
            True,
            "flex/deepep (its expert-parallel group would be 1 rank: TP x EP = 1)",
        ),
        ("hybridep", 1, 2, False, "flex/hybridep (its package is missing on this machine)"),
        ("hybridep", 1, 8, True, None),
        ("ncclep", 2, 1, True, None),
    ],
)
def test_the_flex_dispatcher_falls_back_where_its_back_end_cannot_run_the_layout(
    backend, tp, ep, installed, reason
):
    from harness.run.backend_bridge import flex_backend_unusable

    assert flex_backend_unusable(backend, tp, ep, installed) == reason


def test_a_layout_hybrid_ep_cannot_split_is_refused_in_one_line():
    from harness.run.backend_bridge import hybrid_ep_environment

    with pytest.raises(ValueError, match="expert_model_parallel_size 12 does not fit") as refused:
        hybrid_ep_environment(NEMOTRON_3_NANO_ENV, 12)
    assert "\n" not in str(refused.value)


def test_hybrid_eps_assertion_at_the_first_dispatch_is_a_crash_in_forward(tmp_path):
    def write(writer, rank):
        writer.emit("phase", iteration=1, phase="forward")
        writer.emit(
            "error",
            iteration=1,
            phase="forward",
            type="AssertionError",
            message=HYBRID_EP_ASSERTION,
            local_loss_finite=None,
        )

    outcome = _classify(_ranks(tmp_path, 1, write), tmp_path)
    assert (outcome.status, outcome.iteration, outcome.phase) == ("crash", 1, "forward")
    assert HYBRID_EP_ASSERTION in outcome.message


# Issue 24 item 7: Bridge r0.6's training_log barriers (timers("interval-time").elapsed(barrier=True))
# at each step where iteration % log_interval == 0 (training/utils/train_utils.py); none may be measured.
@pytest.mark.parametrize("name", [n for n in recipe_names() if load_recipe(n).backend == "bridge"])
def test_bridges_logging_barrier_falls_outside_every_measured_step(name):
    from harness.run.backend_bridge import log_interval

    recipe = load_recipe(name)
    interval = log_interval(recipe)
    barriers = [it for it in range(1, recipe.train_iters + 1) if it % interval == 0]
    assert barriers == []


# Issue 24 item 6: peaks were lifetime high-water marks (nothing reset them). A rank now resets the
# allocator's peak statistics at each iteration's first phase, keeping the high-water mark itself.
def test_the_high_water_mark_survives_the_per_iteration_resets():
    from harness.run.instrument import PeakTracker

    tracker = PeakTracker()
    assert tracker.fold(40 * GIB, 50 * GIB) == (40 * GIB, 50 * GIB)  # model build + iteration 1
    assert tracker.fold(30 * GIB, 44 * GIB) == (
        40 * GIB,
        50 * GIB,
    )  # iteration 2 alone, after a reset
    assert tracker.fold(52 * GIB, 60 * GIB) == (52 * GIB, 60 * GIB)  # a late iteration grows


def test_the_peaks_reset_once_per_iteration_at_its_first_phase(tmp_path):
    instrument = Instrument(tmp_path, 0, "cpu")
    instrument.enter(1, "forward")
    instrument.enter(1, "backward")
    assert instrument.peaks_reset_for == 1
    instrument.enter(2, "cuda-graph-capture")  # Bridge's capture runs before the step it precedes
    instrument.enter(2, "forward")
    assert instrument.peaks_reset_for == 2


def test_a_late_iterations_growth_shows_in_its_own_peak_under_an_early_transient(tmp_path):
    recipe = load_recipe("nemotron-3-nano-short-1gpu")
    own = {it: 30 * GIB for it in range(1, recipe.train_iters + 1)}
    own[1], own[9] = 40 * GIB, 35 * GIB  # iteration 1's transient, iteration 9's growth

    def write(writer, rank):
        writer.emit("device", name="NVIDIA H200", sm="9.0")
        high = 0
        for it in range(1, recipe.train_iters + 1):
            high = max(high, own[it])
            writer.emit("phase", iteration=it, phase="forward")
            writer.emit(
                "iteration",
                iteration=it,
                loss=9.0,
                step_time_ms=900.0,
                skipped=False,
                allocated_bytes=high,
                reserved_bytes=50 * GIB,
                device_used_bytes=60 * GIB,
                iteration_allocated_bytes=own[it],
                iteration_reserved_bytes=45 * GIB,
                nan=False,
            )

    ranks = _ranks(tmp_path, 1, write)
    outcome = Classification("completed", recipe.train_iters, None, (), "ok")
    record = build_record(recipe, "[]", ranks, outcome, revisions=_revisions()).to_json()
    validate_record(record)
    peaks = record["metrics"]["ranks"][0]["peaks"]
    assert [p["iteration"] for p in peaks if p["iteration_allocated_bytes"] > 30 * GIB] == [1, 9]
    assert {p["allocated_bytes"] for p in peaks} == {40 * GIB}  # the high-water mark hides it
    headline = record["metrics"]["headline"]
    assert (headline["peak_allocated_bytes"], headline["run_peak_allocated_bytes"]) == (
        40 * GIB,
        40 * GIB,
    )  # the headline goldens hold is unchanged: the high-water mark after iterations 2 and last
