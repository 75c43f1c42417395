"""Tiny style models: real GPTModels from MCore specs, shaped like the models they stand for."""

from __future__ import annotations

import re

import pytest
import torch

from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state
from harness.errors import UsageError
from harness.models import STYLE_MODELS, build_model, buildable_models, style_model


@pytest.fixture(scope="module")
def cpu_group():
    init_cpu_parallel_state()


@pytest.mark.parametrize("name", sorted(STYLE_MODELS))
def test_style_model_trains_one_step(cpu_group, name):
    if name not in buildable_models():
        # Refused in one line, naming what this Megatron Core lacks (mhc-tiny: 0.20 / main only).
        with pytest.raises(UsageError, match=rf"^model '{name}' cannot be built here: "):
            build_model(name, RecomputeFields.selective())
        return
    model = build_model(name, RecomputeFields.selective())
    loss = model.loss(model.batch())
    loss.backward()
    grads = [p.grad for p in model.module.parameters()]
    assert torch.isfinite(loss) and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_moonlight_shape(cpu_group):
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    model = build_model("moonlight-tiny", RecomputeFields.selective())
    layers = model.module.decoder.layers
    assert all(isinstance(layer.self_attention, MLASelfAttention) for layer in layers)
    assert model.config.q_lora_rank is None and model.config.moe_grouped_gemm
    assert not hasattr(layers[0].mlp, "experts")  # first layer dense
    assert all(layer.mlp.shared_experts is not None for layer in layers[1:])
    assert model.config.normalization == "RMSNorm"


def test_nemotron_shape(cpu_group):
    model = build_model("nemotron-tiny", RecomputeFields.selective())
    x = torch.tensor([-1.0, 2.0])
    assert torch.equal(model.config.activation_func(x), torch.tensor([0.0, 4.0]))  # squared ReLU
    assert all(layer.mlp.shared_experts is not None for layer in model.module.decoder.layers)
    assert "Mamba" in style_model("nemotron-tiny").description


def test_the_mhc_model_is_built_only_where_megatron_core_has_hyper_connections(cpu_group):
    import megatron.core.transformer.transformer_layer as layers

    has_them = hasattr(layers, "HyperConnectionTransformerLayer")
    assert ("mhc-tiny" in buildable_models()) is has_them
    assert set(buildable_models()) | {"mhc-tiny"} == set(STYLE_MODELS)  # every other model, always


def test_sizes_are_overridable(cpu_group):
    model = build_model("dense-tiny", RecomputeFields.selective(), seq_length=8, micro_batch_size=3)
    assert model.batch()["input_ids"].shape == (3, 8)
    assert torch.isfinite(model.loss(model.batch()))


@pytest.mark.parametrize(
    "sizes, problem",
    [
        ({"seq_length": 0}, "seq_length must be an integer in [1, 1048576], got 0"),
        ({"micro_batch_size": -2}, "micro_batch_size must be an integer in [1, 1048576], got -2"),
        ({"seq_length": 2.5}, "seq_length must be an integer in [1, 1048576], got 2.5"),
    ],
)
def test_nonsense_sizes_are_usage_errors(sizes, problem):
    with pytest.raises(UsageError, match=re.escape(problem)):
        build_model("dense-tiny", RecomputeFields.selective(), **sizes)


def test_unknown_model_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown model 'llama-huge'"):
        style_model("llama-huge")


def test_gdn_shape(cpu_group):
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet
    from megatron.core.transformer.attention import SelfAttention

    model = build_model("gdn-tiny", RecomputeFields.selective())
    first, second = model.module.decoder.layers
    # linear_attention_freq 2: Gated DeltaNet, then standard attention (each spec its own).
    assert isinstance(first.self_attention, GatedDeltaNet)
    assert isinstance(second.self_attention, SelfAttention)
    # The local back end has no fused norm + linear: the GDN layer keeps its own input norm.
    assert type(first.input_layernorm) is type(second.input_layernorm)
    assert first.self_attention.num_value_heads == 2 * first.self_attention.num_key_heads
