"""The estimate's parts on real MCore layers (in process, TP 1): the Korthikanti et al. anchor, the
fused core attention, the GPU-faithful RMSNorm, the extrapolation, and the estimate's command lines."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state
from harness.estimate.anchors import GPT_ANCHOR, korthikanti_layer_bytes, megatron_lm_layer_bytes
from harness.estimate.estimate import rank_peak
from harness.estimate.fit import extrapolate, quadratic_coefficient
from harness.estimate.layers import build_layer, measure_layer
from harness.estimate.model import DENSE, Architecture
from harness.golden.estimate import judge_estimate
from harness.golden.store import estimate_dir, golden_path_for, golden_root

GOLDEN_ESTIMATE = sorted(estimate_dir(golden_root()).glob("moonlight-full-8gpu__fused__*.json"))
SEED_MOONLIGHT = (
    Path(__file__).parents[3] / "harness" / "data" / "reference" / "seed-moonlight-full-8gpu.json"
)
ANCHOR = Architecture(GPT_ANCHOR, "test", (DENSE,))


@pytest.fixture(scope="module")
def parallel_state():
    init_cpu_parallel_state()


def _anchor_bytes(
    labels: tuple[str, ...], s: int, *, backend: str = "unfused", dropout: bool = True
) -> int:
    layer = build_layer(
        ANCHOR,
        RecomputeFields.selective(*labels),
        DENSE,
        precision="bf16",
        attention_backend=backend,
        dropout=dropout,
    )
    return measure_layer(layer, s, 1).retained_bytes


@pytest.mark.parametrize("s", [64, 256])
def test_gpt_layer_matches_korthikanti_term_by_term(parallel_state, s):
    """Measured = the paper's bytes + MCore's / the CPU's known differences, each one named, exactly.

    - fp32 softmax: MCore's local attention keeps the softmax output in fp32 (attention_softmax_in_fp32
      is on for bf16): 4 bytes per score element, not the paper's 2 (+2·a·s²·b; also on GPU).
    - dropout masks: torch's CPU dropout keeps its mask in the input dtype (bf16, 2 bytes) where CUDA's
      native_dropout keeps bool (1 byte, as the paper counts): +1 per element for the attention-dropout
      mask (a·s²·b) and for the two hidden-dropout masks (2·s·b·h). CPU only.
    - LayerNorm statistics: native_layer_norm keeps mean and rstd, fp32, per token, for both norms
      (16 bytes per token; the paper neglects them; also on GPU).
    - core_attn's checkpoint keeps one 4-byte scalar besides its q, k, v inputs.
    """
    h, a, b = (
        GPT_ANCHOR.config_kwargs["hidden_size"],
        GPT_ANCHOR.config_kwargs["num_attention_heads"],
        1,
    )
    scores = a * s * s * b
    softmax_fp32, cpu_attention_mask = 2 * scores, scores
    cpu_hidden_masks, norm_stats = 2 * s * b * h, 16 * s * b
    full = _anchor_bytes((), s)
    assert (
        full
        == korthikanti_layer_bytes(s, b, h, a)
        + softmax_fp32
        + cpu_attention_mask
        + cpu_hidden_masks
        + norm_stats
    )
    selective = _anchor_bytes(("core_attn",), s)
    assert (
        selective
        == korthikanti_layer_bytes(s, b, h, a, selective=True) + cpu_hidden_masks + norm_stats + 4
    )
    # Stated tolerance: at these widths the CPU-only mask bytes and the norm statistics are the whole
    # gap to the selective formula, 2/34 + 16/(34·h) ≈ 6.1 %; Megatron-LM's formula says the same 34.
    assert selective / korthikanti_layer_bytes(s, b, h, a, selective=True) - 1 < 0.062
    assert megatron_lm_layer_bytes(s, b, h, 4 * h) == korthikanti_layer_bytes(
        s, b, h, a, selective=True
    )


def test_fused_attention_keeps_no_score_matrix(parallel_state):
    """Unfused: an s² term (fp32 softmax 4 + dropout mask 2 on CPU + dropout output 2 = 8 bytes per
    score element; 7 on GPU, where the mask is bool); fused: none, what it keeps grows linearly."""
    lengths = (64, 128, 256)
    h, a = GPT_ANCHOR.config_kwargs["hidden_size"], GPT_ANCHOR.config_kwargs["num_attention_heads"]
    unfused = [_anchor_bytes((), s) for s in lengths]
    fused = [_anchor_bytes((), s, backend="fused", dropout=False) for s in lengths]
    assert quadratic_coefficient(lengths, unfused) == 8 * a
    assert quadratic_coefficient(lengths, fused) == 0
    # Without dropout the unfused layer keeps its scores as fp32 softmax output plus the bf16 copy
    # the value matmul reads (6 bytes per element); fused keeps 4 bytes of log-sum-exp per query
    # row and head instead; everything else (q, k, v, output, linears, norms) is the same.
    unfused_no_dropout = [_anchor_bytes((), s, dropout=False) for s in lengths]
    assert [u - f for u, f in zip(unfused_no_dropout, fused)] == [
        6 * a * s * s - 4 * a * s for s in lengths
    ]
    del h


def test_fused_attention_matches_unfused_numerics(parallel_state):
    """Same loss, gradients equal to fp32 rounding, on the MLA model (value zero-padding path)."""
    from harness.models import build_model
    from harness.probe.measurement.measure import measure

    results = {
        backend: measure(
            build_model("moonlight-tiny", RecomputeFields.selective(), attention_backend=backend)
        )
        for backend in ("unfused", "fused")
    }
    unfused, fused = results["unfused"], results["fused"]
    assert torch.allclose(unfused.loss, fused.loss, atol=1e-6)
    assert set(unfused.grads) == set(fused.grads)
    assert all(torch.allclose(unfused.grads[k], fused.grads[k], atol=1e-6) for k in unfused.grads)
    assert fused.retained_bytes < unfused.retained_bytes


def test_fused_rms_norm_matches_torch_and_keeps_input_and_rstd():
    from harness.cpu.norm import FusedRMSNorm, _RMSNorm

    class Config:
        params_dtype, sequence_parallel = torch.float64, False

    norm = FusedRMSNorm(Config(), 16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16, dtype=torch.float64))
    x = torch.randn(5, 3, 16, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(norm(x), torch.rms_norm(x, (16,), norm.weight, 1e-5))
    assert torch.autograd.gradcheck(lambda a, w: _RMSNorm.apply(a, w, 1e-5), (x, norm.weight))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        norm(x.to(torch.bfloat16))
    assert [(tuple(t.shape), t.dtype) for t in saved] == [
        ((5, 3, 16), torch.bfloat16),
        ((16,), torch.float64),
        ((5, 3, 1), torch.float32),
    ]


def test_extrapolation_is_exact_for_polynomials():
    lengths = (64, 128, 256)
    values = [3 + 5 * s + 7 * s * s for s in lengths]
    assert extrapolate(lengths, values, 4096) == 3 + 5 * 4096 + 7 * 4096**2
    assert quadratic_coefficient(lengths, values) == 7
    assert extrapolate((1, 2), (10, 20), 7) == Fraction(70)
    with pytest.raises(ValueError):
        extrapolate((64, 64), (1, 2), 128)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["estimate", "--recipe", "no-such-recipe"], "unknown recipe 'no-such-recipe'"),
        (["estimate", "--recipe", "cpu-moonlight-ep2"], "is a CPU recipe"),
        (
            ["estimate", "--recipe", "moonlight-full-8gpu", "--rows", "mla_up_proj+"],
            "row 'mla_up_proj+'",
        ),
        (
            ["estimate", "--recipe", "moonlight-full-8gpu", "--attention-backend", "flashy"],
            "invalid choice: 'flashy'",
        ),
    ],
)
def test_estimate_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, message):
    out = tmp_path / "estimate.json"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("recompute-harness: error: ")
    assert not out.exists()


def test_committed_estimate_reproduces_the_cards_conclusions():
    """The harness-written Moonlight estimate: core_attn ≈ 0 under fused attention, mla_up_proj of the
    card's order, mlp inactive on MoE layers, moe_act measured (TEGroupedMLP on the grouped-linear
    stand-ins) and of mla_up_proj's order, as the card found (677 vs 716 MB)."""
    assert GOLDEN_ESTIMATE, (
        "write it with: ./venv-run recompute-harness estimate --recipe moonlight-full-8gpu --write-golden"
    )
    rows = {row["label"]: row for row in json.loads(GOLDEN_ESTIMATE[-1].read_text())["rows"]}
    assert rows["core_attn"]["status"] == "effective" and rows["core_attn"]["saving_pct"] < 0.1
    assert 0.8 < rows["mla_up_proj"]["saving_bytes"] / 716e6 < 1.2
    assert (
        rows["mla_up_proj+mlp"]["per_kind"]["moe"]["saving_bytes"]
        == rows["mla_up_proj"]["per_kind"]["moe"]["saving_bytes"]
    )
    act = rows["moe_act"]
    assert act["status"] == "effective"
    assert act["removed"][0]["module"] == "moe:mlp.experts.linear_fc2"  # the discarded output
    assert 0.5 < act["peak_saving_bytes"] / rows["mla_up_proj"]["peak_saving_bytes"] < 2


def test_analyze_shows_estimate_beside_measured(capsys):
    assert (
        main(["analyze", str(SEED_MOONLIGHT), "--estimate", str(GOLDEN_ESTIMATE[-1]), "--json"])
        == 0
    )
    versus = {
        row["label"]: row for row in json.loads(capsys.readouterr().out)["estimate_vs_measured"]
    }
    assert versus["mla_up_proj"]["measured_saving_bytes"] == 716_000_000
    assert abs(versus["mla_up_proj"]["error_pct"]) < 20
    assert (
        versus["moe_act"]["estimated_saving_bytes"] > 0
        and versus["moe_act"]["measured_saving_bytes"] == 677_000_000
    )


def test_analyze_refuses_an_estimate_of_another_recipe(capsys, tmp_path):
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(
            {**json.loads(GOLDEN_ESTIMATE[-1].read_text()), "recipe": "mcore-moonlight-8gpu"}
        )
    )
    assert main(["analyze", str(SEED_MOONLIGHT), "--estimate", str(other)]) == 2
    assert "the estimate is for recipe 'mcore-moonlight-8gpu'" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text('{"recipe": 1}')
    assert main(["analyze", str(SEED_MOONLIGHT), "--estimate", str(broken)]) == 2


def test_probe_fused_backend_records_and_names_its_golden(parallel_state):
    """The fused probe is its own recipe (own golden), records ``attention_backend: fused``, and its
    core_attn frees only what fused attention keeps beyond its inputs: the fp32 log-sum-exp, per
    layer, less a 4-byte scalar per checkpoint, less the causal mask (s² bool), which the checkpoints
    keep as an input (one storage shared by every layer) and fused attention never reads."""
    from harness.golden.probe import probe_records
    from harness.probe.runner import probe_models

    (probe,) = probe_models(
        ["dense-tiny"], [("core_attn",)], hang_probe=False, attention_backend="fused"
    )
    records = probe_records(probe)
    assert {r.workload.recipe for r in records} == {"cpu-probe-dense-tiny-fused"}
    assert {r.workload.attention_backend for r in records} == {"fused"}
    assert golden_path_for(records, golden_root()).name.startswith(
        "cpu-probe-dense-tiny-fused__cpux0__"
    )
    control, core_attn = probe.rows
    style = probe_models.__globals__["style_model"]("dense-tiny")
    lse = (
        style.config_kwargs["num_layers"]
        * probe.micro_batch_size
        * style.config_kwargs["num_attention_heads"]
        * probe.seq_length
        * 4
    )
    mask = probe.seq_length**2
    assert (
        control.retained_bytes - core_attn.retained_bytes
        == lse - 4 * style.config_kwargs["num_layers"] - mask
    )


def _check_golden_argv(golden_dir: Path, *more: str) -> list[str]:
    return [
        "estimate",
        "--recipe",
        "moonlight-full-8gpu",
        "--check-golden",
        "--golden-dir",
        str(golden_dir),
        *more,
    ]


@pytest.mark.parametrize(
    "more, message",
    [
        ((), "no estimate golden "),  # an empty golden root: nothing to judge against
        (("--write-golden",), "cannot also --write-golden"),
    ],
)
def test_check_golden_without_a_golden_is_one_line_exit_2(capsys, tmp_path, more, message):
    assert main(_check_golden_argv(tmp_path, *more)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("recompute-harness: error: ")
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


def test_check_golden_refuses_a_row_the_golden_lacks_before_measuring(capsys, tmp_path):
    (tmp_path / "estimate").mkdir()
    (tmp_path / "estimate" / GOLDEN_ESTIMATE[-1].name).write_bytes(GOLDEN_ESTIMATE[-1].read_bytes())
    assert main(_check_golden_argv(tmp_path, "--rows", "mla_up_proj", "moe")) == 2
    err = capsys.readouterr().err
    assert "has no row 'moe' to judge" in err and err.count("\n") == 1


def test_judge_names_every_changed_figure_of_a_row():
    golden = json.loads(GOLDEN_ESTIMATE[-1].read_text())
    actual = json.loads(GOLDEN_ESTIMATE[-1].read_text())
    assert judge_estimate(golden, actual) == []
    up = next(row for row in actual["rows"] if row["label"] == "mla_up_proj")
    up["per_kind"]["moe"]["retained_bytes"] += 2  # what a layer kind leaves changed...
    up["status"] = "inactive"  # ...and what the label does
    lines = [mismatch.line() for mismatch in judge_estimate(golden, actual)]
    now = up["per_kind"]["moe"]["retained_bytes"]
    assert lines == [
        "row 'mla_up_proj': status golden 'effective', now 'inactive'",
        f"row 'mla_up_proj': moe retained_bytes golden {now - 2}, now {now} (+0.00 %)",
    ]


def test_peak_is_the_layer_whose_transient_tops_the_layers_retained_up_to_it():
    """Stage [dense, moe]: the dense layer's forward transient (100) comes when only it is retained
    (10), the MoE layer's (5) on top of both layers' bytes (10 + 20); the peak is the larger moment."""

    def measured(values: dict[str, int]) -> list[dict[str, int]]:
        return [{"seq_length": s, **values} for s in (64, 128, 256)]

    result = {
        "kinds": {
            "dense": {
                "[]": [
                    {"seq_length": s, "retained_bytes": 10, "attribution": {}}
                    for s in (64, 128, 256)
                ]
            },
            "moe": {
                "[]": [
                    {"seq_length": s, "retained_bytes": 20, "attribution": {}}
                    for s in (64, 128, 256)
                ]
            },
        },
        "peaks": {
            "dense": {"[]": measured({"forward_transient": 100, "backward_transient": 0})},
            "moe": {"[]": measured({"forward_transient": 5, "backward_transient": 3})},
        },
    }
    assert rank_peak(result, "[]", ["dense", "moe"], 1, 4096) == (110, "forward of layer 0 (dense)")
    # two micro-batches in flight: the other one keeps the whole stage (30) retained throughout
    assert rank_peak(result, "[]", ["dense", "moe"], 2, 4096) == (140, "forward of layer 0 (dense)")
