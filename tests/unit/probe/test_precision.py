"""The bf16 probe pass beside the fp32 one: its own recipe and golden, real bf16 parameters."""

from __future__ import annotations

import pytest
import torch

from harness.config.fields import RecomputeFields
from harness.golden.probe import probe_records, recipe_name
from harness.golden.store import existing, golden_path_for, golden_root, load_golden
from harness.probe.runner import DTYPES, _build, probe_models

# Moonlight's recipe trains in bf16; its style model has MLA, MoE and a dense layer.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def control_only():
    """The ``[]`` row of moonlight-tiny in each precision (in-process, ~2 s)."""
    return {
        precision: probe_models(["moonlight-tiny"], [], precision=precision)[0]
        for precision in ("fp32", "bf16")
    }


def test_bf16_records_name_their_precision_and_recipe(control_only):
    (record,) = probe_records(control_only["bf16"])
    assert record.workload.precision == "bf16"
    assert record.workload.recipe == recipe_name("moonlight-tiny", "unfused", "bf16")
    assert record.workload.recipe == "cpu-probe-moonlight-tiny-bf16"


def test_bf16_keeps_about_half_the_fp32_bytes(control_only):
    fp32, bf16 = (control_only[p].control.retained_bytes for p in ("fp32", "bf16"))
    # Activations halve; what stays fp32 (the loss's logits, router probabilities) keeps it above.
    assert fp32 / 2 <= bf16 < fp32
    # The goldens the harness wrote say the same as this run.
    for precision, measured in (("fp32", fp32), ("bf16", bf16)):
        records = probe_records(control_only[precision])
        golden = load_golden(golden_path_for(records, existing(golden_root(None))))
        assert (
            next(row for row in golden.rows if row.label == "[]").values["retained_bytes"]
            == measured
        )


def test_every_parameter_is_cast_as_float16module_casts_it():
    built = _build(
        "moonlight-tiny",
        RecomputeFields.selective(),
        dropout=False,
        add_bias_linear=None,
        dtype=DTYPES["bf16"],
    )
    assert {p.dtype for p in built.module.parameters()} == {torch.bfloat16}
