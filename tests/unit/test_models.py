"""Tiny style models: real GPTModels from MCore specs, shaped like the models they stand for."""

from __future__ import annotations

import re
from functools import partial

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
    # every other model, always (gdp-tiny: the test below)
    assert set(buildable_models()) | {"mhc-tiny", "gdp-tiny"} == set(STYLE_MODELS)


def test_the_gdp_model_is_built_only_where_megatron_core_has_gated_delta_product(cpu_group):
    import importlib.util

    has_it = importlib.util.find_spec("megatron.core.ssm.gated_delta_product") is not None
    assert ("gdp-tiny" in buildable_models()) is has_it
    if not has_it:
        with pytest.raises(UsageError, match="has no GatedDeltaProduct"):
            build_model("gdp-tiny", RecomputeFields.selective())


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


def test_nemotron_h_is_megatron_cores_hybrid_model_of_its_pattern(cpu_group):
    from megatron.core.models.hybrid.hybrid_model import HybridModel
    from megatron.core.ssm import mamba_mixer
    from megatron.core.ssm.mamba_layer import MambaLayer
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_layer import MoETransformerLayer, TransformerLayer

    from harness.cpu import mamba_kernels

    model = build_model("nemotron-h-tiny", RecomputeFields.selective())
    assert isinstance(model.module, HybridModel)
    layers = model.module.decoder.layers
    assert style_model("nemotron-h-tiny").hybrid_pattern == "M*EME"
    assert [type(layer) for layer in layers] == [
        MambaLayer,
        TransformerLayer,
        MoETransformerLayer,
        MambaLayer,
        MoETransformerLayer,
    ]
    assert all(isinstance(layers[i].mlp, MoELayer) and layers[i].mlp.shared_experts for i in (2, 4))
    # The mixer is MCore's, calling the CPU stand-ins the adapter bound where mamba-ssm is absent.
    assert isinstance(layers[0].mixer, mamba_mixer.MambaMixer)
    assert mamba_mixer.mamba_split_conv1d_scan_combined is (
        mamba_kernels.mamba_split_conv1d_scan_combined
    )
    assert isinstance(layers[0].mixer.norm, mamba_kernels.RMSNormGated)


def test_nemotron_h_full_recompute_checkpoints_the_mamba_layers_bit_for_bit(cpu_group):
    from harness.probe.measurement.measure import measure, retained_by_forward

    control = build_model("nemotron-h-tiny", RecomputeFields.selective())
    full = build_model(
        "nemotron-h-tiny", RecomputeFields(granularity="full", method="uniform", num_layers=1)
    )
    full.module.load_state_dict(control.module.state_dict())
    retained = {}
    for name, model in (("control", control), ("full", full)):
        model.module.train()
        loss = partial(model.loss, model.batch())
        _, _, retained[name] = retained_by_forward(model.module, loss)
    # Without recompute the mixer keeps what mamba-ssm's MambaSplitConv1dScanCombinedFn keeps:
    # zxbcdt [b, l, 2·128 + 2·2·16 + 8] and out_x [b, l, 8, 16] (fp32), plus A = -exp(A_log) and
    # exp's own result (8 heads each).
    tokens = control.micro_batch_size * control.seq_length
    assert retained["control"]["decoder.layers.0.mixer"] == tokens * (328 + 128) * 4 + 2 * 8 * 4
    # Full recompute keeps only the checkpointed inputs, held by the stack: no layer keeps anything.
    assert not [key for key in retained["full"] if key.startswith("decoder.layers.")]
    assert retained["full"]["decoder"] > 0
    a, b = measure(control, instrument=False), measure(full, instrument=False)
    assert torch.equal(a.loss, b.loss)
    assert all(torch.equal(a.grads[name], b.grads[name]) for name in a.grads)


def test_nemotron_h_mixer_paths_agree(cpu_group):
    # The training path (mamba_split_conv1d_scan_combined) and the one MCore keeps for
    # use_mamba_mem_eff_path=False (causal_conv1d_fn, mamba_chunk_scan_combined, the gated norm)
    # run different stand-ins through MCore's own mixer: the same loss and gradients.
    fused = build_model("nemotron-h-tiny", RecomputeFields.selective())
    split = build_model(
        "nemotron-h-tiny", RecomputeFields.selective(), use_mamba_mem_eff_path=False
    )
    split.module.load_state_dict(fused.module.state_dict())
    losses = []
    for model in (fused, split):
        model.module.train()
        losses.append(model.loss(model.batch()))
        losses[-1].backward()
    assert torch.allclose(losses[0], losses[1], rtol=1e-6)
    for a, b in zip(fused.module.parameters(), split.module.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)
