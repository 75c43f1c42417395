"""The reason the probe gives for selective ``layernorm`` not being bitwise, checked on real layers.

Claim (harness.config.label_facts.LABEL_FACTS["layernorm"].sum_order): the row differs from ``[]`` only because
CheckpointWithoutOutput's nested backward pre-sums the norm-input gradient. So a ``[]`` model whose
norms merely sit behind a nested ``torch.autograd.backward`` (nothing recomputed, discarded or
re-stored) must reproduce the ``layernorm`` row's gradients bit for bit.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state
from harness.estimate.estimate import EstimateRow
from harness.models import build_model
from harness.probe.measurement.measure import measure
from harness.probe.measurement.status import MeasuredRow, compare_numerics, sum_order_reason
from harness.probe.runner import ProbeRowResult, single_thread


class _NestedBackward(torch.autograd.Function):
    """``module(x)`` with its input gradient computed by a nested backward, as
    ``CheckpointWithoutOutputFunction.backward`` does, but from the graph built in forward."""

    @staticmethod
    def forward(ctx: Any, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        ctx.x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            ctx.y = module(ctx.x)
        return ctx.y.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        torch.autograd.backward(ctx.y, grad)
        return None, ctx.x.grad


class _BehindNestedBackward(torch.nn.Module):
    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _NestedBackward.apply(self.norm, x)


def _run(fields: RecomputeFields, state: dict[str, Any], *, nested_norms: bool = False):
    model = build_model("dense-tiny", fields)
    model.module.load_state_dict(state)
    if nested_norms:
        for layer in model.module.decoder.layers:
            layer.input_layernorm = _BehindNestedBackward(layer.input_layernorm)
            layer.pre_mlp_layernorm = _BehindNestedBackward(layer.pre_mlp_layernorm)
    result = measure(model, instrument=False)
    grads = {name.replace(".norm.", "."): grad for name, grad in result.grads.items()}
    return result.loss, grads


def test_layernorm_row_differs_from_control_only_by_the_nested_backward_sum():
    init_cpu_parallel_state()
    control_fields, layernorm_fields = (
        RecomputeFields.selective(),
        RecomputeFields.selective("layernorm"),
    )
    with single_thread():
        state = build_model("dense-tiny", control_fields).module.state_dict()
        control = _run(control_fields, state)
        layernorm = _run(layernorm_fields, state)
        nested = _run(control_fields, state, nested_norms=True)

    versus_control = compare_numerics(*layernorm, *control)
    assert versus_control.loss_equal and versus_control.differing_grads > 0
    assert compare_numerics(*layernorm, *nested).bitwise
    assert "CheckpointWithoutOutput" in sum_order_reason(layernorm_fields.modules, versus_control)
    assert sum_order_reason(("core_attn",), versus_control) == ""


def test_probe_and_estimate_rows_share_one_verdict_type_and_keep_their_json_key_order():
    # `probe --json` and `estimate --json` print these dicts: their key order is part of the output.
    probe_row = ProbeRowResult(
        "core_attn",
        "effective",
        retained_bytes=10,
        fields=RecomputeFields.parse("core_attn"),
        add_bias_linear=False,
    )
    estimate_row = EstimateRow("core_attn", "effective", retained_bytes=10, saving_bytes=2)
    assert isinstance(probe_row, MeasuredRow) and isinstance(estimate_row, MeasuredRow)
    assert list(probe_row.as_dict()) == [
        "label",
        "fields",
        "add_bias_linear",
        "status",
        "reason",
        "rule",
        "retained_bytes",
        "backward_flops",
        "replay_bytes",
        "replay_ops",
        "equivalence",
        "dropout_equivalence",
        "attribution",
        "carried_bytes",
        "carried_attribution",
        "carried_holders",
        "step_peaks",  # issue 23: peaks over the step (harness.probe.measurement.peaks)
        "inflight_bytes",  # issue 23: a pipeline stage's micro-batches in flight, appended last
    ]
    assert ProbeRowResult.from_dict(probe_row.as_dict()) == probe_row
    assert list(asdict(estimate_row)) == [
        "label",
        "status",
        "reason",
        "rule",
        "retained_bytes",
        "saving_bytes",
        "saving_pct",
        "partial_saving_bytes",
        "per_kind",
        "removed",
        "attribution",
        "peak_bytes",  # issue 23: the rank's activation peak moment, appended last
        "peak_saving_bytes",
        "peak_phase",
    ]
