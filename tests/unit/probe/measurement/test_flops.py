"""The probe's FLOP counter counts exactly what torch's FlopCounterMode counts, on real MCore layers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state, reseed
from harness.models import build_model
from harness.probe.measurement import flops
from harness.probe.measurement.measure import ReplayCounter


def _backward(
    model_name: str,
    row: str,
    counting: Callable[[ReplayCounter], contextlib.AbstractContextManager[FlopCounterMode]],
) -> tuple[dict, int, int]:
    """Per-module FLOP counts, replayed bytes and operators of the second backward of a fresh model
    (as in a probe, what a first step builds once is built by then), counted by ``counting``."""
    init_cpu_parallel_state()
    model = build_model(model_name, RecomputeFields.parse(row))
    batch = model.batch()
    model.loss(batch).backward()
    model.module.zero_grad(set_to_none=True)
    reseed(1234)
    loss = model.loss(batch)
    seed_grad = torch.ones_like(loss)
    replay = ReplayCounter()
    with counting(replay) as counter:
        loss.backward(seed_grad)
    return counter.get_flop_counts(), replay.bytes, replay.ops


def _two_modes(
    counter: FlopCounterMode,
) -> Callable[[ReplayCounter], contextlib.AbstractContextManager[FlopCounterMode]]:
    """``counter`` with the replay counter entered above it as a mode of its own."""

    @contextlib.contextmanager
    def counting(replay: ReplayCounter) -> Iterator[FlopCounterMode]:
        with counter, replay:
            yield counter

    return counting


ROWS = [("dense-tiny", "full-uniform-1"), ("dense-tiny", "core_attn"), ("moonlight-tiny", "moe")]


@pytest.mark.parametrize(("model_name", "row"), ROWS)
def test_the_cheaper_counter_counts_and_replays_exactly_what_flopcountermode_does(model_name, row):
    cheaper = flops.flop_counter()
    assert type(cheaper) is flops._CheapFlopCounterMode  # torch 2.14.1: the reviewed code
    upstream = _backward(model_name, row, _two_modes(FlopCounterMode(display=False)))
    counted = _backward(model_name, row, _two_modes(cheaper))
    assert counted == upstream
    assert sum(upstream[0]["Global"].values()) > 0 and upstream[2] > 0  # it counted and replayed


# What the probe runs: the replay counter handed each operator by the FLOP counter's own dispatch.
@pytest.mark.parametrize(("model_name", "row"), ROWS)
def test_one_shared_dispatch_counts_and_replays_exactly_what_two_modes_do(model_name, row):
    upstream = _backward(model_name, row, _two_modes(FlopCounterMode(display=False)))
    shared = _backward(model_name, row, flops.counting_flops_and)
    assert shared == upstream and upstream[2] > 0


def test_an_operator_with_a_composite_kernel_is_decomposed_and_counted_as_upstream_does():
    # Such operators are decomposed before they reach a mode when called normally; handed to each
    # dispatch directly (the mode not yet on the stack), both decompose aten.linear into the matmul
    # they count, and both decline a metadata query.
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    counts = []
    for mode_class in (_FlopCounterMode, flops._DecomposingOnlyCompositesMode):
        counter = FlopCounterMode(display=False)
        mode = mode_class(counter)
        out = mode.__torch_dispatch__(torch.ops.aten.linear.default, (), (x, w))
        declined = mode.__torch_dispatch__(torch.ops.aten.dim.default, (), (x,))
        assert torch.equal(out, x @ w.T) and declined is NotImplemented
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 2 * 4 * 8 * 16


def test_an_observer_sees_a_decomposed_operator_once_as_it_arrived():
    # As the replay counter above the counter's mode saw it: aten.linear with its arguments and
    # result, not the matmul its decomposition issues; a declined query is not seen.
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    seen = []

    class Observer:
        def count(self, args, kwargs, out):
            seen.append((args, out))

    counter = FlopCounterMode(display=False)
    mode = flops._DecomposingOnlyCompositesMode(counter, Observer())
    out = mode.__torch_dispatch__(torch.ops.aten.linear.default, (), (x, w))
    assert mode.__torch_dispatch__(torch.ops.aten.dim.default, (), (x,)) is NotImplemented
    ((args, observed),) = seen
    assert args == (x, w) and observed is out and counter.get_total_flops() == 2 * 4 * 8 * 16


@pytest.mark.parametrize("changed", ["OpOverload.decompose", "_FlopCounterMode.__torch_dispatch__"])
def test_another_torch_gets_flopcountermode_as_it_is(monkeypatch, changed):
    monkeypatch.setitem(flops._REVIEWED_FLOP_COUNTER, changed, "0" * 16)
    flops._flop_counter_is_reviewed.cache_clear()
    try:
        assert type(flops.flop_counter()) is FlopCounterMode
    finally:
        flops._flop_counter_is_reviewed.cache_clear()


def test_a_torch_without_the_dispatch_class_gets_flopcountermode_as_it_is(monkeypatch):
    monkeypatch.delattr(flops.upstream, "_FlopCounterMode")
    flops._flop_counter_is_reviewed.cache_clear()
    try:
        assert type(flops.flop_counter()) is FlopCounterMode
    finally:
        flops._flop_counter_is_reviewed.cache_clear()
