"""The estimate's hybrid layer model (Nemotron 3 Nano): the architecture from Bridge's recipe values and
the recipe's layer pattern, and what each row does to each layer kind, measured on real MCore layers
(``MambaLayer`` on the CPU kernel stand-ins, attention-only ``TransformerLayer``,
``MoETransformerLayer``) in process at TP 1, at shrunk widths and short sequences, and assembled as
``estimate`` assembles the ranks' results."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from harness.cli import main
from harness.cpu.adapter import init_cpu_parallel_state
from harness.estimate.estimate import UNMEASURED, EstimateTarget, assemble
from harness.estimate.model import ATTENTION, MAMBA, MLP, MOE, architecture, hybrid_layer_kinds
from harness.estimate.worker import measure_kinds
from harness.golden.store import estimate_dir, golden_root
from harness.models import style_model
from harness.probe.measurement.status import CONTROL_STATUS, EFFECTIVE
from harness.run.recipes import load_recipe

GOLDEN = sorted(estimate_dir(golden_root()).glob("nemotron-3-nano-full-16gpu__fused__*.json"))
SEED = (
    Path(__file__).parents[3]
    / "harness"
    / "data"
    / "reference"
    / "seed-nemotron-3-nano-full-16gpu.json"
)
SHORT = "nemotron-3-nano-short-8gpu"  # pattern MEM*EM: every kind of the full model
ROWS = ["[]", "layernorm", "moe", "moe+layernorm", "core_attn", "moe_act", "layernorm+moe_act"]
ROWS_FULL = [*ROWS, "full-uniform-1"]
SEQS = (16, 32, 64)
# Nemotron 3 Nano's layer shapes at a fraction of their widths (the same kinds, heads, groups and
# expert routing), so the tier measures each kind in well under a second.
SHRUNK = {
    "hidden_size": 128,
    "num_attention_heads": 4,
    "kv_channels": 32,
    "ffn_hidden_size": 64,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "mamba_state_dim": 16,
    "mamba_num_groups": 2,
    "num_moe_experts": 8,
    "moe_ffn_hidden_size": 64,
    "moe_shared_expert_intermediate_size": 128,
}


def _provider_values() -> dict:
    text = resources.files("harness").joinpath("data", "bridge", "nemotron-3-nano-30b-a3b.json")
    return json.loads(text.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def estimate():
    """The short recipe's estimate at 512 tokens, from one in-process rank's real measurements."""
    recipe = replace(load_recipe(SHORT), seq_length=512)
    arch = architecture(recipe)
    arch = replace(arch, style=replace(arch.style, config_kwargs={**arch.config, **SHRUNK}))
    init_cpu_parallel_state()
    with pytest.MonkeyPatch.context() as patch:
        # MCore's torch.compile'd helpers run eagerly, as in the ranks the estimate starts
        # (measure_recipe's environment): otherwise their first call builds with Inductor (~25 s).
        patch.setenv("TORCH_COMPILE_DISABLE", "1")
        measured = measure_kinds(
            arch,
            ROWS_FULL,
            precision=recipe.precision,
            attention_backend="fused",
            micro_batch_size=recipe.micro_batch_size,
            seq_lengths=list(SEQS),
        )
    result = {
        "rank": 0,
        **measured,
        "layer_kinds": list(arch.layer_kinds),
        "model": arch.style.name,
        "source": arch.source,
    }
    out = assemble(EstimateTarget.of_recipe(recipe), ROWS_FULL, "fused", [result], SEQS)
    return out, {row.label: row for row in out.rows}


def test_architecture_is_bridges_nemotron_3_nano_and_its_pattern():
    values = _provider_values()
    pattern = values["hybrid_layer_pattern"]
    full = architecture(load_recipe("nemotron-3-nano-full-16gpu"))
    assert full.style.hybrid_pattern == pattern and len(pattern) == values["num_layers"]
    assert len(full.layer_kinds) == full.config["num_layers"] == values["num_layers"]
    counts = {kind: full.layer_kinds.count(kind) for kind in full.kinds}
    assert counts == {
        MAMBA: pattern.count("M"),
        MOE: pattern.count("E"),
        ATTENTION: pattern.count("*"),
    }
    for key in ("hidden_size", "mamba_num_heads", "mamba_state_dim", "num_moe_experts"):
        assert full.config[key] == values[key]
    short_recipe = load_recipe(SHORT)
    short = architecture(short_recipe)  # [bridge.model] shortens the stack, the widths stay
    assert (
        short.style.hybrid_pattern == short_recipe.backend_options["model"]["hybrid_layer_pattern"]
    )
    assert short.config["hidden_size"] == full.config["hidden_size"]
    assert len(short.layer_kinds) == short.config["num_layers"] < full.config["num_layers"]


def test_rows_reach_the_layer_kinds_mcore_applies_them_to(estimate):
    out, rows = estimate
    assert out.layers == {MAMBA: 3, MOE: 2, ATTENTION: 1}
    control = rows["[]"]
    assert control.status == CONTROL_STATUS
    assert all(part["retained_bytes"] > 0 for part in control.per_kind.values())
    measured = [rows[label] for label in ("layernorm", "moe", "moe+layernorm", "core_attn")]
    # MambaLayer has no selective recompute: no label changes a Mamba layer's bytes.
    assert all(row.per_kind[MAMBA]["saving_bytes"] == 0 for row in measured)
    assert all(MAMBA in row.reason for row in measured)
    # layernorm: the MoE layers' pre-MLP norm only; the attention layer's norm is fused into its
    # QKV projection, as in MCore's TE hybrid spec, so MCore does not checkpoint it.
    layernorm = rows["layernorm"]
    assert layernorm.status == EFFECTIVE and layernorm.per_kind[ATTENTION]["saving_bytes"] == 0
    assert layernorm.saving_bytes == layernorm.per_kind[MOE]["saving_bytes"] > 0
    # moe frees the MoE layers' retained bytes down to their input; adding layernorm frees more.
    moe, both = rows["moe"], rows["moe+layernorm"]
    assert moe.saving_bytes == moe.per_kind[MOE]["saving_bytes"] > layernorm.saving_bytes
    assert both.saving_bytes > moe.saving_bytes
    assert moe.retained_bytes == control.retained_bytes - moe.saving_bytes
    # core_attn under fused attention: only the attention layer's softmax statistics.
    core_attn = rows["core_attn"]
    assert core_attn.saving_bytes == core_attn.per_kind[ATTENTION]["saving_bytes"] > 0
    assert core_attn.saving_bytes < layernorm.saving_bytes


def test_moe_act_is_measured_and_full_rows_report_what_is_not_measured(estimate):
    """moe_act runs in TEGroupedMLP on the adapter's grouped-linear stand-ins; its checkpoint and the
    norms' sit in different places, so layernorm+moe_act frees exactly what each frees alone."""
    _, rows = estimate
    act = rows["moe_act"]
    assert act.status == EFFECTIVE and act.saving_bytes > 0
    assert rows["layernorm+moe_act"].status == EFFECTIVE
    assert (
        rows["layernorm+moe_act"].saving_bytes == rows["layernorm"].saving_bytes + act.saving_bytes
    )
    assert rows["full-uniform-1"].status == UNMEASURED


@pytest.mark.parametrize(
    "pattern, layers, message",
    [
        ("MQ*", 3, "hybrid layer pattern 'MQ*' has symbol(s) 'Q'"),
        ("MG*", 3, "hybrid layer pattern 'MG*' has MCore layer symbol(s) 'G'"),
        ("ME*E", 3, "hybrid layer pattern 'ME*E' has 4 entries for 3 layers"),
    ],
)
def test_a_pattern_the_estimate_cannot_build_is_one_line_exit_2(
    capsys, tmp_path, pattern, layers, message
):
    recipe = tmp_path / "nano.toml"
    recipe.write_text(
        f'base = "nemotron-3-nano-short-1gpu"\n\n[bridge.model]\nnum_layers = {layers}\n'
        f'hybrid_layer_pattern = "{pattern}"\n'
    )
    out = tmp_path / "estimate.json"
    assert main(["estimate", "--recipe", str(recipe), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("recompute-harness: error: ")
    assert not out.exists()


def test_an_mlp_layer_is_mcores_mlp_layer_with_its_norm_fused_as_on_gpu():
    """Nemotron-H's ``-`` layers (none in Nemotron 3 Nano): ``mlp`` checkpoints the MLP, and
    ``layernorm`` does not reach its norm, fused into ``linear_fc1`` as in MCore's TE hybrid spec."""
    recipe = replace(load_recipe(SHORT), seq_length=512)
    arch = architecture(recipe)
    pattern = "M-"
    arch = replace(
        arch,
        style=replace(
            arch.style,
            config_kwargs={**arch.config, **SHRUNK, "num_layers": len(pattern)},
            hybrid_pattern=pattern,
        ),
        layer_kinds=hybrid_layer_kinds(pattern, "test"),
    )
    rows = ["[]", "layernorm", "mlp"]
    init_cpu_parallel_state()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_COMPILE_DISABLE", "1")
        measured = measure_kinds(
            arch,
            rows,
            precision=recipe.precision,
            attention_backend="fused",
            micro_batch_size=1,
            seq_lengths=list(SEQS),
        )
    mlp = {row: [m["retained_bytes"] for m in measured["kinds"][MLP][row]] for row in rows}
    assert mlp["layernorm"] == mlp["[]"]
    assert all(after < before for after, before in zip(mlp["mlp"], mlp["[]"], strict=True))


def test_an_mcore_recipe_of_a_hybrid_style_model_takes_its_kinds_from_the_pattern(tmp_path):
    recipe = tmp_path / "hybrid.toml"
    recipe.write_text(
        'description = "nemotron-h-tiny through the mcore loop"\n'
        'backend = "mcore"\nmodel = "nemotron-h-tiny"\ndevice = "cuda"\n'
        "nnodes = 1\nnproc_per_node = 1\nseq_length = 256\nmicro_batch_size = 1\n"
        'global_batch_size = 1\ntrain_iters = 2\nprecision = "bf16"\n'
        'attention_backend = "fused"\nsteady_window = [1, 2]\nrows = ["[]"]\n'
    )
    pattern = style_model("nemotron-h-tiny").hybrid_pattern
    arch = architecture(load_recipe(str(recipe)))
    assert arch.layer_kinds == hybrid_layer_kinds(pattern, "test")
    assert set(arch.kinds) == {MAMBA, ATTENTION, MOE} and len(arch.layer_kinds) == len(pattern)


def test_committed_estimate_beside_the_cards_peaks_taken_at_the_same_point():
    """The harness-written estimate of the card's recipe against the card's two peak differences
    between rows measured at the same point (docs/estimate.md): moe -> moe+layernorm (both completed,
    after iteration 2) is the MoE layers' norm outputs; [] -> moe_act (after iteration 1) is the
    experts' activation outputs its checkpoint discards. Stated tolerance: 1 %."""
    assert GOLDEN, (
        "write it with: ./venv-run recompute-harness estimate --recipe nemotron-3-nano-full-16gpu "
        "--write-golden"
    )
    golden = json.loads(GOLDEN[-1].read_text())
    rows = {row["label"]: row for row in golden["rows"]}
    card = {
        tuple(record["recompute"]["recompute_modules"]): record["metrics"]["headline"][
            "peak_allocated_bytes"
        ]
        for record in json.loads(SEED.read_text())
    }
    layernorm_under_moe = rows["moe+layernorm"]["saving_bytes"] - rows["moe"]["saving_bytes"]
    card_layernorm = card[("moe",)] - card[("moe", "layernorm")]
    assert abs(layernorm_under_moe - card_layernorm) / card_layernorm < 0.01
    card_moe_act = card[()] - card[("moe_act",)]
    assert abs(rows["moe_act"]["saving_bytes"] - card_moe_act) / card_moe_act < 0.01
    assert [r["module"] for r in rows["moe_act"]["removed"]] == ["moe:mlp.experts.linear_fc2"]
    assert all(row["per_kind"].get(MAMBA, {}).get("saving_bytes", 0) == 0 for row in rows.values())
