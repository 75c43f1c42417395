"""The CPU stand-ins of TE's grouped linear (the adapter's part 10): they save what TE v2.17.1's
``_GroupedLinear`` saves on its non-FP8 path, views of the caller's input, and the grouped-GEMM MoE
models build Megatron Core's own ``TEGroupedMLP`` over them."""

from __future__ import annotations

import pytest
import torch

from harness.config.fields import RecomputeFields
from harness.cpu import adapter, self_check
from harness.cpu.grouped_linear import (
    CpuColumnParallelGroupedLinear,
    CpuRowParallelGroupedLinear,
)
from harness.models.build import build_model


@pytest.fixture(scope="module", autouse=True)
def cpu_group():
    adapter.init_cpu_parallel_state()


@pytest.mark.parametrize("linear", [CpuColumnParallelGroupedLinear, CpuRowParallelGroupedLinear])
def test_the_stand_in_saves_views_of_the_callers_input_as_te_does(linear):
    # TE v2.17.1 grouped_linear.py, _GroupedLinear.forward (non-FP8): it saves
    # torch.split(cast_if_needed(inp.reshape(-1, in_features), activation_dtype), m_splits), views
    # of the caller's tensor, so moe_act's discard of linear_fc2's input frees what fc2 saved.
    assert self_check.saved_input_problems(linear) == []


class _CopyingStandIn(CpuRowParallelGroupedLinear):
    """A stand-in that saves a copy of its input: moe_act would then free nothing."""

    def forward(self, x, m_splits):
        return super().forward(x.clone(), m_splits)


def test_a_stand_in_that_saves_a_copy_fails_the_check():
    problems = self_check.saved_input_problems(_CopyingStandIn)
    # Expert splits [2, 0, 3] of the check: two non-empty views, both of the copy's storage.
    assert problems == [
        (
            "_CopyingStandIn saves 2 tensor(s) [(2, 8), (3, 8)] that are not views of its input: "
            "TE's GroupedLinear saves the per-expert views (an output-discard checkpoint frees them)"
        )
    ]


def test_the_adapter_binds_te_grouped_linear_names_only_where_te_is_absent():
    from megatron.core.extensions import transformer_engine_spec_provider as te_spec

    if adapter.transformer_engine_available():
        pytest.skip("Transformer Engine is installed: its grouped linear is real")
    assert te_spec.TEColumnParallelGroupedLinear is CpuColumnParallelGroupedLinear
    assert te_spec.TERowParallelGroupedLinear is CpuRowParallelGroupedLinear
    assert self_check.grouped_linear_problems() == []


@pytest.mark.parametrize("model", ["moonlight-tiny", "nemotron-tiny", "nemotron-h-tiny"])
def test_grouped_gemm_models_build_megatron_cores_te_grouped_mlp(model):
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    built = build_model(model, RecomputeFields.selective("moe_act"))
    experts = [m for name, m in built.module.named_modules() if name.endswith(".experts")]
    assert experts and all(type(m) is TEGroupedMLP for m in experts)
    assert all(m.activation_recompute for m in experts)  # TEGroupedMLP read moe_act itself
    assert {type(m.linear_fc1) for m in experts} == {CpuColumnParallelGroupedLinear}
    assert {type(m.linear_fc2) for m in experts} == {CpuRowParallelGroupedLinear}


def test_moe_act_frees_linear_fc2s_input_until_backward():
    # moonlight-tiny fp32, one MoE layer's experts: with moe_act the activation's output (fc2's
    # saved input) has no storage between forward and backward, and the gradients are []'s.
    grads = {}
    for fields in (RecomputeFields.selective(), RecomputeFields.selective("moe_act")):
        built = build_model("moonlight-tiny", fields)
        loss = built.loss(built.batch())
        if fields.modules:
            experts = built.module.decoder.layers[1].mlp.experts
            assert all(
                o.untyped_storage().nbytes() == 0 for o in experts.activation_checkpoint.outputs
            )
        loss.backward()
        grads[fields.name] = [
            p.grad.clone() for p in built.module.parameters() if p.grad is not None
        ]
    assert all(torch.equal(a, b) for a, b in zip(grads["[]"], grads["moe_act"], strict=True))
