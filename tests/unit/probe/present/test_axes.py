"""Coverage as data (harness.probe.present.axes): measured axis values, and why the others are outside."""

from __future__ import annotations

import json

import pytest
import torch

from harness.cli import main
from harness.config.fields import RecomputeFields
from harness.cpu import adapter
from harness.cpu.adapter import init_cpu_parallel_state
from harness.probe.measurement.status import REQUIRES_CUDA
from harness.probe.plan import ProbeRow
from harness.probe.present.axes import MEASURED, NOT_PROBED, coverage
from harness.probe.runner import baseline, measure_row, probe_models

# One MoE model, two rows, one precision, plus the dispatcher attempt and layer-kind builds (~4 s).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def axes():
    probes = probe_models(["moonlight-tiny"], [("moe",)], hang_probe=False)
    found = coverage(probes)
    return {(entry["axis"], entry["value"]): entry for entry in found["axes"]}, found["labels"]


def test_the_style_models_dispatcher_is_measured(axes):
    entries, _ = axes
    assert entries[("MoE token dispatcher", "allgather")]["status"] == MEASURED
    assert entries[("MoE token dispatcher", "allgather")]["where"] == ["moonlight-tiny"]


def test_a_dispatcher_no_probed_model_uses_is_tried_on_one(axes):
    entries, _ = axes
    # moonlight-tiny runs allgather; alltoall is tried on it (its CUDA side stream: the adapter).
    alltoall = entries[("MoE token dispatcher", "alltoall")]
    assert alltoall["status"] == MEASURED and alltoall["where"] == ["moonlight-tiny"]
    assert alltoall["reason"].startswith("ran on CPU")


def test_layer_kinds_come_from_the_built_modules(axes):
    entries, _ = axes
    # moonlight-tiny: MLA attention, a dense first layer, then MoE layers.
    for kind in ("MLA", "dense MLP", "MoE"):
        assert entries[("layer kind", kind)]["status"] == MEASURED
    assert entries[("layer kind", "attention")]["status"] == NOT_PROBED
    # Mamba layers are nemotron-h-tiny's, which this run did not probe: the reason says so.
    assert entries[("layer kind", "Mamba")]["status"] == NOT_PROBED
    assert "nemotron-h-tiny" in entries[("layer kind", "Mamba")]["reason"]


def test_axes_outside_the_probe_say_why(axes):
    entries, _ = axes
    for key in (("pipeline parallel", "PP 2"), ("tensor parallel", "TP 2 + sequence parallel")):
        assert entries[key]["status"] == NOT_PROBED and entries[key]["reason"]
    assert "#4921" in entries[("full recompute", "skip_final_recompute")]["reason"]
    assert entries[("precision", "bf16")]["reason"] == "not in this run: probe --precision bf16"


def test_labels_list_the_passes_that_measured_them(axes):
    _, labels = axes
    assert labels == {"moe": ["moonlight-tiny (fp32, unfused)"]}


def test_probe_coverage_json(capsys):
    argv = ["probe", "--model", "dense-tiny", "--modules", "core_attn", "--jobs", "1"]
    assert main([*argv, "--precision", "fp32", "--coverage", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert {"axis": "precision", "value": "fp32"}.items() <= found["axes"][0].items()
    assert found["labels"]["core_attn"] == ["dense-tiny (fp32, unfused)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the alltoall dispatcher builds")
def test_a_row_mcore_cannot_build_on_cpu_is_a_requires_cuda_row_not_a_traceback(monkeypatch):
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    init_cpu_parallel_state()
    base = baseline("moonlight-tiny")
    # Without the adapter's part 7 (CPU streams), the alltoall dispatcher asks torch.cuda for one.
    monkeypatch.setattr(torch.cuda, "Stream", adapter._ORIGINALS["torch.cuda.Stream"])
    monkeypatch.setattr(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", None)
    row = measure_row(
        "moonlight-tiny",
        ProbeRow(RecomputeFields.full("uniform", 1)),
        base,
        moe_token_dispatcher_type="alltoall",  # the overrides reach TransformerConfig
    )
    assert row.status == REQUIRES_CUDA and not row.measured
    assert "token_dispatcher.py" in row.reason  # the MCore line that asked for CUDA


def test_nemotron_h_brings_the_mamba_layer_kind():
    from harness.probe.present.axes import _layer_kinds

    init_cpu_parallel_state()
    assert _layer_kinds("nemotron-h-tiny") == {"attention", "MoE", "Mamba"}
