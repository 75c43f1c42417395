"""Probe results as the skill's tables (label, retained MiB, vs [] %, backward GFLOPs, vs [] %, ...)."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from harness.probe.layouts.pipeline import PIPELINE_MICROBATCHES
from harness.probe.measurement.peaks import PHASES
from harness.probe.measurement.status import (
    CRASH,
    EFFECTIVE,
    ERROR,
    HANG,
    REQUIRES_CUDA,
    REQUIRES_TE,
)
from harness.probe.present.coverage import (
    describe_unmeasured,
    unmeasured_entries,
    unmeasured_everywhere,
)
from harness.probe.runner import ModelProbe, ProbeRowResult

MIB = 1024 * 1024
_LAYER_CHILD = re.compile(r"^(.*?layers\.\d+)((?:\.[^.]+){0,2})")


def _pct(value: int | None, base: int | None) -> str:
    if value is None or not base:
        return "-"
    if value == base:
        return "0.00%"
    return f"{(value - base) / base * 100:+.2f}%"


def _delta_kib(value: int | None, base: int | None) -> str:
    if value is None or base is None:
        return "-"
    return "0" if value == base else f"{(value - base) / 1024:+.1f}"


def _equivalence(row: ProbeRowResult, precision: str) -> str:
    if row.equivalence is None or row.dropout_equivalence is None:
        return "-"
    plain, dropout = row.equivalence, row.dropout_equivalence
    if plain.bitwise and dropout.bitwise:
        return f"bitwise ({precision}, dropout)"
    return f"{precision} {plain.summary}; dropout {dropout.summary}"


def _status(row: ProbeRowResult) -> str:
    if row.rule:
        return f"{row.status} [{row.rule}]"
    if row.status in (HANG, CRASH, ERROR, REQUIRES_CUDA, REQUIRES_TE) or (
        row.status == EFFECTIVE and row.reason
    ):
        return f"{row.status}: {row.reason}"
    return row.status


def probe_table(probe: ModelProbe) -> str:
    control = probe.control
    tensor_parallel = (
        f", TP {probe.tensor_parallel} + sequence parallel (per rank; the ranks agree)"
        if probe.tensor_parallel > 1
        else ""
    )
    lines = [
        f"## {probe.model} — {probe.description}",
        (
            f"seq {probe.seq_length}, micro-batch {probe.micro_batch_size}, {probe.precision}, CPU, {probe.attention_backend} "
            f"core attention{tensor_parallel}; bytes retained by "
            "autograd at the end of forward; FLOPs of backward (matmul-class ops); bytes a second step leaves "
            "alive after backward (carried)"
        ),
        "",
        (
            "| Label | Retained MiB | vs `[]` | Backward GFLOPs | vs `[]` | Replayed MiB | Carried KiB | vs `[]` KiB "
            "| Equivalence | Status |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in probe.rows:
        if row.measured:
            values = row.values()
            cells = [
                f"{values.retained_bytes / MIB:.3f}",
                _pct(values.retained_bytes, control.retained_bytes),
                f"{values.backward_flops / 1e9:.4f}",
                _pct(values.backward_flops, control.backward_flops),
                f"{values.replay_bytes / MIB:.3f}",
                "-" if row.carried_bytes is None else f"{row.carried_bytes / 1024:.1f}",
                _delta_kib(row.carried_bytes, control.carried_bytes),
            ]
        else:
            cells = ["-"] * 7
        lines.append(_row_line(row, control, cells, probe.precision))
    return "\n".join(lines)


def pipeline_table(probe: ModelProbe) -> str:
    """One stage of a pipeline probe (harness.probe.layouts.pipeline): per row what the stage retains for one
    micro-batch and, under 1F1B, for the micro-batches in flight at once."""
    control = probe.control
    lines = [
        f"## {probe.model}, PP {probe.pipeline_parallel} stage {probe.stage} — {probe.description}",
        (
            f"seq {probe.seq_length}, micro-batch {probe.micro_batch_size}, {probe.precision}, CPU, "
            f"{probe.attention_backend} core attention; {PIPELINE_MICROBATCHES} micro-batches through "
            "Megatron Core's 1F1B schedule; bytes retained by autograd when a micro-batch's forward "
            "returns, and the most held at once for the micro-batches in flight"
        ),
        "",
        (
            "| Label | Retained MiB | vs `[]` | In flight MiB | In flight ÷ retained | Backward GFLOPs | "
            "vs `[]` | Replayed MiB | Equivalence | Status |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in probe.rows:
        if row.measured and row.inflight_bytes is not None:
            values = row.values()
            cells = [
                f"{values.retained_bytes / MIB:.3f}",
                _pct(values.retained_bytes, control.retained_bytes),
                f"{row.inflight_bytes / MIB:.3f}",
                f"{row.inflight_bytes / values.retained_bytes:.2f}",
                f"{values.backward_flops / 1e9:.4f}",
                _pct(values.backward_flops, control.backward_flops),
                f"{values.replay_bytes / MIB:.3f}",
            ]
        else:
            cells = ["-"] * 7
        lines.append(_row_line(row, control, cells, probe.precision))
    return "\n".join(lines)


def module_group(path: str) -> str:
    """``decoder.layers.1.mlp.experts.local_experts.0.linear_fc1`` -> ``decoder.layers.1.mlp.experts``."""
    match = _LAYER_CHILD.match(path)
    return match.group(1) + match.group(2) if match else (path or "(model)")


def grouped_attribution(attribution: dict[str, int]) -> dict[str, int]:
    grouped: dict[str, int] = defaultdict(int)
    for path, nbytes in attribution.items():
        grouped[module_group(path)] += nbytes
    return dict(grouped)


def attribution_table(probe: ModelProbe) -> str:
    """Retained bytes per module for ``[]`` and the change each measured row makes there."""
    rows = [row for row in probe.rows if row.measured]
    grouped = {row.label: grouped_attribution(row.attribution) for row in rows}
    control = grouped[probe.control.label]
    modules = sorted(
        {module for values in grouped.values() for module in values},
        key=lambda m: (-control.get(m, 0), m),
    )
    changed = [
        row.label for row in rows if row is not probe.control and grouped[row.label] != control
    ]
    header = [
        "Module (saved in its forward)",
        "`[]` KiB",
        "share",
        *[f"`{label}` Δ KiB" for label in changed],
    ]
    lines = [
        f"### {probe.pass_name}: where the retained activation bytes are",
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    total = sum(control.values()) or 1
    for module in modules:
        base = control.get(module, 0)
        deltas = [grouped[label].get(module, 0) - base for label in changed]
        cells = [
            f"{base / 1024:.1f}",
            f"{base / total * 100:.1f}%",
            *[f"{delta / 1024:+.1f}" if delta else "" for delta in deltas],
        ]
        lines.append("| " + " | ".join([module, *cells]) + " |")
    return "\n".join(lines)


def unmeasured_table(probes: list[ModelProbe]) -> str:
    """The labels no probed model exercises, with each model's reason ("" when every label is measured)."""
    missing = unmeasured_everywhere(probes)
    if not missing:
        return ""
    lines = [
        (
            f"## Unmeasured labels: accepted by this Megatron Core, exercised by none of "
            f"{', '.join(dict.fromkeys(probe.model for probe in probes))}"
        ),
        "",
        "| Label | Why, per model |",
        "|---|---|",
    ]
    for label, entries in missing.items():
        why = "; ".join(f"{model}: {describe_unmeasured(entry)}" for model, entry in entries)
        lines.append(f"| `{label}` | unmeasured — {why.replace('|', '/')} |")
    return "\n".join(lines)


def carried_table(probe: ModelProbe) -> str:
    """Who holds what each row carries across the step, as a change against ``[]`` per holding module."""
    rows = [row for row in probe.rows if row.measured and row.carried_bytes is not None]
    grouped = {row.label: grouped_attribution(row.carried_attribution) for row in rows}
    control = grouped.get(probe.control.label, {})
    modules = sorted(
        {module for values in grouped.values() for module in values},
        key=lambda m: (-control.get(m, 0), m),
    )
    changed = [
        row.label for row in rows if row is not probe.control and grouped[row.label] != control
    ]
    header = [
        "Holder module (carried after backward)",
        "`[]` KiB",
        *[f"`{label}` Δ KiB" for label in changed],
    ]
    lines = [
        f"### {probe.pass_name}: memory carried across the step, by holder",
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for module in modules:
        base = control.get(module, 0)
        deltas = [grouped[label].get(module, 0) - base for label in changed]
        lines.append(
            "| "
            + " | ".join(
                [
                    module,
                    f"{base / 1024:.1f}",
                    *[f"{delta / 1024:+.1f}" if delta else "" for delta in deltas],
                ]
            )
            + " |"
        )
    holders = _extra_holders(probe, rows)
    if holders:
        lines += ["", "Held beyond `[]` (row: holder, shape, dtype, bytes):"]
        lines += [f"- `{label}`: {holder}" for label, holder in holders]
    return "\n".join(lines)


def peaks_table(probe: ModelProbe) -> str:
    """Per row, each phase's peak (bytes beyond the weights, harness.probe.measurement.peaks) and the decoder layer
    whose own backward peak is highest: where recompute moved the step's peak."""
    lines = [
        f"### {probe.pass_name}: peaks over the step (MemTracker; KiB beyond parameters and the batch)",
        "",
        "| Row | forward | backward | optimizer | step's peak in | hottest layer (its backward peak KiB) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in probe.rows:
        if not row.step_peaks:
            continue
        phases = {phase: row.step_peaks[phase]["step_bytes"] for phase in PHASES}
        layers = {
            name: peaks["backward"]
            for name, peaks in row.step_peaks["modules"].items()
            if name.count(".") == 2
        }
        # A layer whose backward runs inside a checkpoint's nested backward (full recompute) has no
        # backward peak of its own in MemTracker's module hooks: shown as "-", not as 0.
        hottest = max(layers, key=lambda name: (layers[name], name), default=None)
        hot = (
            "-"
            if not hottest or not layers[hottest]
            else f"{hottest} ({layers[hottest] / 1024:.1f})"
        )
        lines.append(
            f"| `{row.label}` | "
            + " | ".join(f"{phases[phase] / 1024:.1f}" for phase in PHASES)
            + f" | {max(PHASES, key=lambda phase: phases[phase])} | {hot} |"
        )
    return "\n".join(lines)


def _extra_holders(probe: ModelProbe, rows: list[ProbeRowResult]) -> list[tuple[str, str]]:
    """Each row's held storages whose (holder, shape) the control does not hold."""

    def key(holder: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
        return holder["holder"], tuple(holder["shape"])

    control = {key(holder) for holder in probe.control.carried_holders}
    out = []
    for row in rows:
        if row is probe.control:
            continue
        counts: dict[str, list[int]] = defaultdict(list)
        for h in row.carried_holders:
            if key(h) not in control:
                counts[f"{h['holder']} {list(h['shape'])} {h['dtype']}"].append(h["nbytes"])
        out += [
            (row.label, f"{what} ×{len(sizes)}, {sum(sizes)} bytes")
            for what, sizes in counts.items()
        ]
    return out


def _row_line(
    row: ProbeRowResult, control: ProbeRowResult, cells: list[str], precision: str
) -> str:
    """One markdown row: the label, the measured cells, the equivalence verdict and the status."""
    label = "`[]`" if row is control else f"`{row.label}`"
    return "| " + " | ".join([label, *cells, _equivalence(row, precision), _status(row)]) + " |"


def probe_json(probe: ModelProbe) -> dict[str, Any]:
    return {
        "model": probe.model,
        "description": probe.description,
        "seq_length": probe.seq_length,
        "micro_batch_size": probe.micro_batch_size,
        "attention_backend": probe.attention_backend,
        "precision": probe.precision,
        "rows": [row.as_dict() for row in probe.rows],
        "unmeasured": unmeasured_entries(probe),
        **(
            {"pipeline_parallel": probe.pipeline_parallel, "stage": probe.stage}
            if probe.pipeline_parallel > 1
            else {}
        ),
        **({"tensor_parallel": probe.tensor_parallel} if probe.tensor_parallel > 1 else {}),
    }


def coverage_table(coverage: dict[str, Any]) -> str:
    """``probe --coverage``: each axis value with where it was measured or why it was not, then
    per label the passes that measured it (harness.probe.present.axes)."""
    lines = [
        "## Coverage: configuration axes of this probe run",
        "",
        "| Axis | Value | Status | Measured on / why not |",
        "|---|---|---|---|",
    ]
    for entry in coverage["axes"]:
        where = ", ".join(entry["where"])
        detail = "; ".join(part for part in (where, entry["reason"]) if part)
        lines.append(
            f"| {entry['axis']} | `{entry['value']}` | {entry['status']} | {detail.replace('|', '/')} |"
        )
    lines += ["", "| Label | Measured (effective) on |", "|---|---|"]
    for label, where in coverage["labels"].items():
        lines.append(
            f"| `{label}` | {', '.join(where) or 'unmeasured (why: the unmeasured labels table)'} |"
        )
    return "\n".join(lines)
