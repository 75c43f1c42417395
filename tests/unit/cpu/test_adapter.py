"""The CPU adapter: what it replaces is reviewed, its behavioural self-check passes here and fails\nwhen the adapter is broken, and what it adapts really works."""

from __future__ import annotations

import itertools

import pytest
import torch

from harness.config.label_facts import labels_relying_on
from harness.cpu import adapter, self_check
from harness.errors import UsageError


@pytest.fixture(scope="module")
def cpu_group():
    adapter.init_cpu_parallel_state()


def test_replaced_objects_still_match_their_review():
    # Review notes, not a gate: a bump that changes a replaced object is reported by name (in the
    # probe's output and the golden's provenance); re-read the change, then add its digest.
    assert adapter.replaced_drift() == []


def test_replaced_drift_is_reported_by_name_not_refused(monkeypatch, cpu_group):
    name = "megatron.core.tensor_parallel.random._set_cuda_rng_state"
    monkeypatch.setitem(adapter.PATCHED_SURFACE, name, {"0" * 16: "a revision never installed"})
    assert adapter.drifted_objects() == [name]
    assert self_check.require_working_adapter("write CPU goldens") == adapter.replaced_drift()
    assert adapter.replaced_drift()[0].startswith(f"{name}: source digest ")


def test_only_what_the_adapter_replaces_is_pinned():
    # The code under test (checkpoint classes, the RNG tracker and its callers) is never pinned.
    assert all(
        name.startswith("torch.")
        or name.rsplit(".", 1)[-1] in {"_get_cuda_rng_state", "_set_cuda_rng_state"}
        for name in adapter.PATCHED_SURFACE
    )


def test_every_pin_names_the_revisions_it_was_reviewed_on():
    for name, reviewed in adapter.PATCHED_SURFACE.items():
        assert reviewed and all(
            len(digest) == 16 and revisions for digest, revisions in reviewed.items()
        ), name


def test_self_check_passes_on_the_installed_revision(cpu_group):
    assert self_check.self_check_problems() == []


def test_self_check_fails_when_the_rng_state_saved_is_not_the_one_dropout_draws_from(
    monkeypatch, cpu_group
):
    # A broken "CUDA" RNG state (the adapter's part 2): each save answers some other generator's
    # state, so a restore replays masks that were never drawn. The adapter's fault: refused.
    from megatron.core.tensor_parallel import random as mcore_random

    seeds = itertools.count(100)
    monkeypatch.setattr(
        mcore_random,
        "_get_cuda_rng_state",
        lambda *args, **kwargs: torch.Generator().manual_seed(next(seeds)).get_state(),
    )
    assert self_check.rng_problems() == [
        (
            "the RNG state _get_cuda_rng_state saves, restored by _set_cuda_rng_state, does not "
            "replay a dropout mask"
        )
    ]
    with pytest.raises(UsageError, match=r"refusing to judge CPU goldens: .*fails its self-check"):
        self_check.require_working_adapter("judge CPU goldens")


def test_megatron_cores_checkpoints_replay_bitwise_here(cpu_group):
    assert self_check.checkpoint_findings() == []


def test_a_checkpoint_finding_names_the_rows_relying_on_its_class(cpu_group):
    # The edits of random.py that make these findings are the unreleased step's
    # (tests/unit/commands/test_broken_checkpoints.py); here, what a finding says.
    finding = self_check.CheckpointFinding(
        "CheckpointWithoutOutput",
        "CheckpointWithoutOutput kept its output's storage (no discard happened)",
        labels_relying_on("CheckpointWithoutOutput"),
    )
    # 0.19.2 accepts these four output-discard labels (gdp_in_proj and gdp_qkv: the head only).
    assert finding.line() == (
        "Megatron Core's CheckpointWithoutOutput kept its output's storage (no discard happened); "
        "the rows relying on CheckpointWithoutOutput: layernorm, mla_up_proj, moe_act, gdn_norm_out"
    )
    assert labels_relying_on("CheckpointFunction") == (
        "core_attn",
        "mlp",
        "moe",
        "shared_experts",
        "full recompute",
    )


def test_self_check_names_an_unbound_te_name_on_the_output_discard_path(monkeypatch, cpu_group):
    from megatron.core.tensor_parallel import random as mcore_random

    monkeypatch.delattr(mcore_random, "fp8_autocast", raising=False)
    assert self_check.self_check_problems() == [
        (
            "the CPU adapter does not bind fp8_autocast (a Transformer Engine name), which "
            "CheckpointWithoutOutput._recompute looks up in megatron.core.tensor_parallel.random"
        )
    ]
    with pytest.raises(UsageError) as refused:
        self_check.require_working_adapter("write CPU goldens")
    assert "\n" not in str(refused.value) and "fp8_autocast" in str(refused.value)


def test_fp8_names_are_unbound_upstream_without_te():
    if adapter.transformer_engine_available():
        pytest.skip("Transformer Engine is installed: the adapter binds no FP8 names")
    assert not any(adapter._FP8_NAMES_BOUND_UPSTREAM.values())


def test_enable_is_idempotent_and_installs_exactly_the_surface(cpu_group):
    from megatron.core.tensor_parallel import random as mcore_random

    assert adapter.enable_cpu_adapter() is True
    installed = (
        torch.cuda.current_device,
        torch.cuda.get_rng_state,
        mcore_random._set_cuda_rng_state,
    )
    assert adapter.enable_cpu_adapter() is True
    assert (
        torch.cuda.current_device,
        torch.cuda.get_rng_state,
        mcore_random._set_cuda_rng_state,
    ) == installed
    assert torch.cuda.current_device() == "cpu"
    assert mcore_random.FP8GlobalStateManager.is_fp8_enabled() is False


def test_rng_tracker_fork_replays_dropout(cpu_group):
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    def masks():
        adapter.reseed(7)
        with get_cuda_rng_tracker().fork():
            first = torch.nn.functional.dropout(torch.ones(64), 0.5)
        outside = torch.nn.functional.dropout(torch.ones(64), 0.5)
        return first, outside

    (a, outside_a), (b, outside_b) = masks(), masks()
    assert torch.equal(a, b) and torch.equal(outside_a, outside_b)
    assert not torch.equal(a, outside_a)  # the tracker's stream is its own


def test_output_discard_checkpoint_runs_and_matches_plain_autograd(cpu_group):
    from megatron.core.tensor_parallel.random import CheckpointWithoutOutput

    x = torch.randn(8, 16, requires_grad=True)
    weight = torch.randn(16, 16, requires_grad=True)

    def plain():
        return (torch.nn.functional.silu(x) @ weight).sum()

    plain().backward()
    expected_x, expected_w = x.grad.clone(), weight.grad.clone()
    x.grad = weight.grad = None

    checkpoint = CheckpointWithoutOutput()
    activated = checkpoint.checkpoint(torch.nn.functional.silu, x)
    out = (activated @ weight).sum()
    checkpoint.discard_output_and_register_recompute(out)
    assert activated.untyped_storage().nbytes() == 0  # discarded until backward recomputes it
    out.backward()
    assert torch.equal(x.grad, expected_x) and torch.equal(weight.grad, expected_w)


def test_deferred_compile_compiles_on_first_call_exactly_as_upstream():
    # Part 4: the suite's processes import MCore with torch.compile deferred (tests/conftest.py), so
    # MCore's jit_fuser helpers hold deferred wrappers; the compiler itself is imported at a first call.
    from megatron.core import jit
    from megatron.core.fusions import fused_bias_geglu

    from harness.cpu.deferred_compile import _deferred_compile, upstream_compile

    assert jit.jit_fuser is _deferred_compile and torch.compile is _deferred_compile
    assert fused_bias_geglu.geglu.__wrapped__.__name__ == "geglu"  # a deferred wrapper, same name
    calls = []
    compiled = _deferred_compile(
        lambda x: x * 2, backend=lambda gm, inputs: calls.append(gm) or gm.forward
    )
    assert calls == []  # decorating compiled nothing
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0)) and len(calls) == 1
    assert (
        torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0)) and len(calls) == 1
    )  # compiled once
    assert (
        upstream_compile() is adapter._ORIGINALS["torch.compile"]
        and upstream_compile() is not torch.compile
    )


def test_cuda_stream_names_are_cpu_streams_whose_events_synchronize(cpu_group):
    # The alltoall dispatcher's side-stream pattern: wait, copy on the stream, record, synchronize.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        copied = torch.arange(4).to("cpu")
    event = side.record_event()
    event.synchronize()
    assert event.query() and torch.equal(copied, torch.arange(4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="part 8 is off where CUDA is real")
def test_cuda_allocations_land_on_the_cpu_inside_the_schedule_call_only():
    # The 1F1B schedule's token counter; a device given otherwise (or none) is left as it is.
    with adapter.cuda_allocations_on_cpu():
        counter = torch.zeros([], dtype=torch.int, device="cuda")
        named = torch.ones(2, device=torch.device("cuda", 0))
        plain = torch.arange(3)
    assert counter.device.type == named.device.type == plain.device.type == "cpu"
    with pytest.raises(RuntimeError):
        torch.zeros([], device="cuda")  # outside the call a CPU-only torch refuses, as before


def test_alltoall_dispatcher_runs_on_cpu_and_matches_allgather_bit_for_bit(cpu_group):
    # At EP 1 both dispatchers route the same tokens to the same experts: the stream stand-ins
    # change no numerics, only which MCore path (permutation, splits, recompute) runs.
    from harness.config.fields import RecomputeFields
    from harness.models import build_model

    results = []
    for dispatcher in ("allgather", "alltoall"):
        model = build_model(
            "moonlight-tiny", RecomputeFields.selective("moe"), moe_token_dispatcher_type=dispatcher
        )
        loss = model.loss(model.batch())
        loss.backward()
        grads = {n: p.grad for n, p in model.module.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and all(
        torch.equal(grads_a[n], grads_b[n]) for n in grads_a
    )


def test_mamba_kernels_are_bound_only_where_megatron_core_left_them_unbound(cpu_group):
    from megatron.core.ssm import mamba_mixer

    from harness.cpu import mamba_kernels

    # Bound once by enable_cpu_adapter (mamba-ssm and causal-conv1d are absent here); a second call
    # finds nothing unbound, so it never replaces what it (or an installed package) bound.
    assert mamba_mixer.HAVE_MAMBA_SSM
    assert mamba_mixer.causal_conv1d_fn is mamba_kernels.causal_conv1d_fn
    assert mamba_mixer.ExtendedRMSNorm is mamba_kernels.RMSNormGated
    assert adapter.bind_mamba_kernels() == []


def test_a_collective_returns_once_gloo_has_let_go_of_its_tensors(cpu_group):
    # Without part 9, about a third of these all-reduces (a world of one, gloo) returned while gloo's
    # worker thread still held the tensor: alive at a phase's peak, by the machine's load.
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    still_held = 0
    for _ in range(500):
        tensor = torch.randn(32, 2)
        before = tensor._use_count()
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        still_held += tensor._use_count() != before
    assert still_held == 0
    # async_op: already complete, and the values are the collective's.
    tensor = torch.arange(4.0)
    handle = dist.all_reduce(tensor, async_op=True)
    assert handle.is_completed() and handle.wait() and tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    gathered = torch.empty(4)
    mappings.dist_all_gather_func(gathered, tensor)  # bound at Megatron Core's import: rebound
    assert gathered.equal(tensor)
    original = adapter.original_collectives()["all_gather_into_tensor"]
    assert mappings.dist_all_gather_func.__wrapped_collective__ is original


def test_self_check_names_a_megatron_global_left_on_an_unsettled_collective(monkeypatch, cpu_group):
    from megatron.core.tensor_parallel import mappings

    original = adapter.original_collectives()["reduce_scatter_tensor"]
    monkeypatch.setattr(mappings, "dist_reduce_scatter_func", original)
    expected = (
        "megatron.core.tensor_parallel.mappings.dist_reduce_scatter_func is torch's own "
        "reduce_scatter_tensor, which returns before gloo lets go of its tensors"
    )
    assert self_check.collective_problems() == [expected]
    with pytest.raises(UsageError, match="dist_reduce_scatter_func is torch's own"):
        self_check.require_working_adapter("write CPU goldens")
