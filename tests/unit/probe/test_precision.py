"""The bf16 probe pass beside the fp32 one: its own recipe and golden, real bf16 parameters."""

from __future__ import annotations

import pytest
import torch

from harness.config.fields import RecomputeFields
from harness.golden.probe import check_probe_golden, probe_records, recipe_name
from harness.golden.store import existing, golden_path_for, golden_root, load_golden
from harness.probe.runner import DTYPES, _build, probe_models

# Moonlight's recipe trains in bf16; its style model has MLA, MoE and a dense layer (~6 s).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bf16_probe():
    (probe,) = probe_models(["moonlight-tiny"], precision="bf16")
    return probe


def test_bf16_golden_matches(bf16_probe):
    path, problems = check_probe_golden(bf16_probe)
    assert path.name.startswith("cpu-probe-moonlight-tiny-bf16__")
    assert not problems, "\n".join(problems)


def test_bf16_records_name_their_precision_and_recipe(bf16_probe):
    records = probe_records(bf16_probe)
    assert {record.workload.precision for record in records} == {"bf16"}
    assert {record.workload.recipe for record in records} == {
        recipe_name("moonlight-tiny", "unfused", "bf16")
    }


def test_bf16_keeps_about_half_the_fp32_bytes(bf16_probe):
    # The fp32 golden of the same model (written by the harness) holds the fp32 control's bytes.
    fp32_records = probe_records(
        probe_models(["moonlight-tiny"], label_sets=[], hang_probe=False)[0]
    )
    fp32 = load_golden(golden_path_for(fp32_records, existing(golden_root(None))))
    fp32_control = next(row for row in fp32.rows if row.label == "[]").values["retained_bytes"]
    bf16_control = bf16_probe.control.retained_bytes
    # Activations halve; what stays fp32 (the loss's logits, router probabilities) keeps it above.
    assert fp32_control / 2 <= bf16_control < fp32_control


def test_the_deadlock_row_is_left_to_the_fp32_pass(bf16_probe):
    assert not any(row.add_bias_linear for row in bf16_probe.rows)


def test_every_parameter_is_cast_as_float16module_casts_it():
    built = _build(
        "moonlight-tiny",
        RecomputeFields.selective(),
        dropout=False,
        add_bias_linear=None,
        dtype=DTYPES["bf16"],
    )
    assert {p.dtype for p in built.module.parameters()} == {torch.bfloat16}
