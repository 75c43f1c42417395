"""The order workers take probe passes in: each model's first pass in the given order, then the
passes of models whose earlier pass took longest first, so no worker ends alone on a long pass."""

from __future__ import annotations

from harness.probe.workers.passes import _next_pass, _Pass


def test_first_passes_in_order_then_the_longest_models_first():
    passes = [
        _Pass(model, precision, "unfused") for precision in ("fp32", "bf16") for model in "abc"
    ]
    waiting, took, taken = list(enumerate(passes)), {}, []
    for seconds in (10.0, 30.0, 20.0):  # a, b and c's fp32 passes finish, in turn
        _, task = _next_pass(waiting, took)
        taken.append(task)
        took[task.model] = seconds
    while waiting:
        taken.append(_next_pass(waiting, took)[1])
    assert [(task.model, task.precision) for task in taken] == [
        ("a", "fp32"),
        ("b", "fp32"),
        ("c", "fp32"),
        ("b", "bf16"),
        ("c", "bf16"),
        ("a", "bf16"),
    ]


def test_a_model_not_run_yet_goes_before_any_measured_one():
    a, d = _Pass("a", "bf16", "unfused"), _Pass("d", "fp32", "fused")
    waiting = [(3, a), (4, d)]
    assert _next_pass(waiting, {"a": 99.0}) == (4, d)
    assert waiting == [(3, a)]
