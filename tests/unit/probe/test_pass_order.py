"""The order workers take probe passes in: each model's first pass in the given order, then the
passes of models whose earlier pass took longest first, so no worker ends alone on a long pass."""

from __future__ import annotations

from harness.probe.workers.passes import _next_pass


def test_first_passes_in_order_then_the_longest_models_first():
    passes = [
        ("a", "fp32"),
        ("b", "fp32"),
        ("c", "fp32"),
        ("a", "bf16"),
        ("b", "bf16"),
        ("c", "bf16"),
    ]
    waiting, took, taken = list(enumerate(passes)), {}, []
    for seconds in (10.0, 30.0, 20.0):  # a, b and c's fp32 passes finish, in turn
        _, task = _next_pass(waiting, took)
        taken.append(task)
        took[task[0]] = seconds
    while waiting:
        taken.append(_next_pass(waiting, took)[1])
    assert taken == [
        ("a", "fp32"),
        ("b", "fp32"),
        ("c", "fp32"),
        ("b", "bf16"),
        ("c", "bf16"),
        ("a", "bf16"),
    ]


def test_a_model_not_run_yet_goes_before_any_measured_one():
    waiting = [(3, ("a", "bf16")), (4, ("d", "fp32"))]
    assert _next_pass(waiting, {"a": 99.0}) == (4, ("d", "fp32"))
    assert waiting == [(3, ("a", "bf16"))]
