"""Coverage as data: which configuration axes the probe measured, where, and why the rest is outside.

Axes: precision, attention back end, MoE token dispatcher, tensor / pipeline parallelism, full
recompute's method x ``recompute_num_layers``, and the layer kinds of the style models. Each value
is ``measured`` (with the models it was measured on), or says why not: ``requires-CUDA`` when the
installed Megatron Core was tried on CPU and needs CUDA (the exception is the reason), ``error`` /
``rejected`` for what the revision raised, ``not-probed`` with the stated reason (another command
measures it, or nothing does yet). Values are read from the probe's own results, the models it
built and the installed ``TransformerConfig`` (the dispatcher names are its field's ``Literal``),
never from a list of what a revision is expected to do. Per label: the passes that measured it.
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

from harness.config.fields import SKIP_FINAL_FIELD
from harness.config.validate import config_has_field
from harness.cpu.adapter import init_cpu_parallel_state
from harness.models import STYLE_MODELS, build_model, not_on_this_tree
from harness.probe.measurement.status import EFFECTIVE, failure_status
from harness.probe.plan import CONTROL, PRECISIONS
from harness.probe.present.coverage import single_label_rows
from harness.probe.runner import ModelProbe

MEASURED, NOT_PROBED = "measured", "not-probed"
# The probe runs one process with TP = PP = EP = 1 (harness.cpu.adapter.init_cpu_parallel_state);
# its pipeline pass (harness.probe.layouts.pipeline) runs PP stages under torchrun, its TP pass
# (harness.probe.layouts.tensor_parallel) every row on each rank of a TP group with sequence parallel.
PIPELINE_SIZES = (1, 2)  # always listed: PP 2 says how to measure it when a run did not
LAYER_KINDS = (
    "attention",
    "MLA",
    "Gated DeltaNet",
    "GatedDeltaProduct",
    "dense MLP",
    "MoE",
    "hyper-connections",
    "Mamba",
    "MTP",
)


@dataclass
class AxisValue:
    axis: str
    value: str
    status: str
    where: list[str] = field(default_factory=list)  # passes (model, precision, back end)
    reason: str = ""


def _pass_name(probe: ModelProbe) -> str:
    stage = (
        f", PP {probe.pipeline_parallel} stage {probe.stage}" if probe.pipeline_parallel > 1 else ""
    )
    tp = f", TP {probe.tensor_parallel} + SP" if probe.tensor_parallel > 1 else ""
    return f"{probe.model} ({probe.precision}, {probe.attention_backend}{stage}{tp})"


def _config_fields() -> dict[str, Any]:
    from megatron.core.transformer.transformer_config import TransformerConfig

    hints = typing.get_type_hints(TransformerConfig)
    return {f.name: hints.get(f.name) for f in dataclasses.fields(TransformerConfig)}


def dispatcher_names() -> tuple[str, ...]:
    """The token dispatchers the installed ``TransformerConfig`` declares (its field's Literal)."""
    return tuple(typing.get_args(_config_fields()["moe_token_dispatcher_type"]))


def _try_dispatcher(model: str, dispatcher: str) -> tuple[str, str]:
    """Build ``model`` with ``dispatcher`` and run one forward + backward of the control."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = build_model(model, CONTROL, moe_token_dispatcher_type=dispatcher)
            built.loss(built.batch()).backward()
    except Exception as exc:  # noqa: BLE001 - what the revision does on CPU is the finding
        return failure_status(exc)
    return MEASURED, "ran on CPU (forward + backward of []); not in the probe's goldens"


def _layer_kinds(model: str) -> set[str]:
    """The layer kinds a style model's built modules contain (class names, not its config)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = build_model(model, CONTROL).module
    names = {type(m).__name__ for m in module.modules()}
    kinds = set()
    if "MLASelfAttention" in names:
        kinds.add("MLA")
    elif "SelfAttention" in names:
        kinds.add("attention")
    if "MLP" in names and any(
        type(m).__name__ == "MLP" and name.endswith(".mlp") for name, m in module.named_modules()
    ):
        kinds.add("dense MLP")
    if "GatedDeltaNet" in names:
        kinds.add("Gated DeltaNet")
    if "GatedDeltaProductMixer" in names:
        kinds.add("GatedDeltaProduct")
    if "MoELayer" in names:
        kinds.add("MoE")
    if "HyperConnectionModule" in names:
        kinds.add("hyper-connections")
    # The Mamba-2 mixer itself: a GatedDeltaProduct mixer sits in a MambaLayer too.
    if "MambaMixer" in names:
        kinds.add("Mamba")
    if any("MultiTokenPrediction" in name for name in names):
        kinds.add("MTP")
    return kinds


def coverage(probes: list[ModelProbe]) -> dict[str, Any]:
    """The coverage of ``probes`` (every pass of one probe command) as JSON-ready data."""
    # The layer kinds and dispatchers are read from models built here: a pipeline run's stages
    # were built in their ranks, and this process has no model-parallel state of its own yet.
    init_cpu_parallel_state()
    values: list[AxisValue] = []
    passes = [_pass_name(probe) for probe in probes]
    models = list(dict.fromkeys(probe.model for probe in probes))

    def add(axis: str, value: str, where: list[str], reason_if_none: str) -> None:
        if where:
            values.append(AxisValue(axis, value, MEASURED, where))
        else:
            values.append(AxisValue(axis, value, NOT_PROBED, reason=reason_if_none))

    for precision in PRECISIONS:
        add(
            "precision",
            precision,
            [p for p, probe in zip(passes, probes, strict=True) if probe.precision == precision],
            f"not in this run: probe --precision {precision}",
        )
    for backend in ("unfused", "fused"):
        add(
            "attention back end",
            backend,
            [
                p
                for p, probe in zip(passes, probes, strict=True)
                if probe.attention_backend == backend
            ],
            f"not in this run: probe --attention-backend {backend} (its own goldens)",
        )
    moe_models = [m for m in models if "num_moe_experts" in STYLE_MODELS[m].config_kwargs]
    for dispatcher in dispatcher_names():
        native = [
            m
            for m in moe_models
            if STYLE_MODELS[m].config_kwargs.get("moe_token_dispatcher_type") == dispatcher
        ]
        if native:
            values.append(AxisValue("MoE token dispatcher", dispatcher, MEASURED, native))
            continue
        for model in moe_models[:1]:  # one MoE model is enough to find what the dispatcher needs
            status, reason = _try_dispatcher(model, dispatcher)
            values.append(AxisValue("MoE token dispatcher", dispatcher, status, [model], reason))
    add(
        "tensor parallel",
        "TP 1",
        list(dict.fromkeys(probe.model for probe in probes if probe.tensor_parallel == 1)),
        "not in this run: probe without --tensor-parallel",
    )
    for size in sorted({*PIPELINE_SIZES, *(probe.pipeline_parallel for probe in probes)}):
        staged = [probe for probe in probes if probe.pipeline_parallel == size]
        add(
            "pipeline parallel",
            f"PP {size}",
            list(dict.fromkeys(probe.model for probe in staged))
            if size == 1
            else [_pass_name(probe) for probe in staged],
            "not in this run: probe without --pipeline-parallel"
            if size == 1
            else f"not in this run: probe --model NAME --pipeline-parallel {size} (one golden "
            "per stage; docs/probe-coverage.md)",
        )
    for size in sorted({2, *(probe.tensor_parallel for probe in probes)} - {1}):
        add(
            "tensor parallel",
            f"TP {size} + sequence parallel",
            [_pass_name(probe) for probe in probes if probe.tensor_parallel == size],
            f"not in this run: probe --model NAME --tensor-parallel {size} (every row on each "
            "rank, the ranks must agree; also per layer by `estimate --recipe`; "
            "docs/probe-coverage.md)",
        )
    values += _full_recompute_values(probes)
    kinds = {model: _layer_kinds(model) for model in models}
    why_not = {
        "Mamba": not_on_this_tree(STYLE_MODELS["nemotron-h-tiny"])
        or "nemotron-h-tiny (Mamba layers on the CPU stand-ins of harness/cpu/mamba_kernels.py) "
        "was not probed",
        "hyper-connections": not_on_this_tree(STYLE_MODELS["mhc-tiny"])
        or "mhc-tiny was not probed",
    }
    for kind in LAYER_KINDS:
        where = [model for model in models if kind in kinds[model]]
        add("layer kind", kind, where, why_not.get(kind, "no probed model has this layer kind"))
    return {
        "axes": [dataclasses.asdict(value) for value in values],
        "labels": _label_passes(probes),
    }


def _full_recompute_values(probes: list[ModelProbe]) -> list[AxisValue]:
    """method x recompute_num_layers (and ``skip_final_recompute``, which only some revisions'
    TransformerConfig has) per pass, as measured or as the revision's status."""
    found: dict[tuple[bool, str, int], AxisValue] = {}
    for probe in probes:
        for row in probe.rows:
            fields = row.fields
            if fields.granularity != "full":
                continue
            key = (fields.skip_final, fields.method or "", fields.num_layers or 0)
            value = f"{fields.method} x {fields.num_layers}"
            value += f" + {SKIP_FINAL_FIELD}" if fields.skip_final else ""
            name = _pass_name(probe)
            entry = found.setdefault(key, AxisValue("full recompute", value, MEASURED))
            if row.measured:
                entry.where.append(name)
            else:
                entry.reason += f"{'; ' if entry.reason else ''}{name}: {row.status}: {row.reason}"
                if not entry.where:
                    entry.status = row.status
    values = [found[key] for key in sorted(found)]
    if not any(skip for skip, _, _ in found):
        values.append(
            AxisValue(
                "full recompute",
                SKIP_FINAL_FIELD,
                NOT_PROBED,
                reason=(
                    f"TransformerConfig has {SKIP_FINAL_FIELD}, but no probed model ran full "
                    "recompute rows"
                    if config_has_field(SKIP_FINAL_FIELD)
                    else f"this revision's TransformerConfig has no {SKIP_FINAL_FIELD} field "
                    "(Megatron-LM #4921)"
                ),
            )
        )
    return values


def _label_passes(probes: list[ModelProbe]) -> dict[str, list[str]]:
    """label -> the passes where its single-label row was effective (empty: unmeasured)."""
    labels: dict[str, list[str]] = {}
    for probe in probes:
        for row in single_label_rows(probe):
            where = labels.setdefault(row.label, [])
            if row.status == EFFECTIVE:
                where.append(_pass_name(probe))
    return labels
