"""Which accepted labels a probe did not exercise, and why: listed as ``unmeasured``, never dropped.

A label is exercised on a model when its single-label row is ``effective``. Every other status
(``inactive``: the model lacks the feature; ``rejected``: the validator wants a feature the model
lacks; ``requires-TE``; ``hang``; ``crash``) leaves the label unmeasured there, with the row's reason.
Across models, a label no model exercises is unmeasured by the whole probe: tables, JSON and golden
diffs say so (a new label on a Megatron Core bump shows up here before any style model covers it).
"""

from __future__ import annotations

from typing import Any

from harness.probe.measurement.status import EFFECTIVE
from harness.probe.runner import ModelProbe, ProbeRowResult


def single_label_rows(probe: ModelProbe) -> list[ProbeRowResult]:
    """The rows that probe one accepted label alone (in plan order), the deadlock probe aside."""
    return [
        row
        for row in probe.rows
        if row.fields.granularity == "selective"
        and not row.add_bias_linear
        and row.fields.modules is not None
        and len(row.fields.modules) == 1
    ]


def unmeasured_entries(probe: ModelProbe) -> list[dict[str, Any]]:
    """The accepted labels this model does not exercise, then the full-recompute rows without a
    measurement (rejected, or raising: ``error``), with status, rule id and reason. A golden keeps
    them, so a revision that starts or stops running a full row is a change."""
    unmeasured = [row for row in single_label_rows(probe) if row.status != EFFECTIVE]
    unmeasured += [
        row for row in probe.rows if row.fields.granularity == "full" and not row.measured
    ]
    return [
        {"label": row.label, "status": row.status, "rule": row.rule, "reason": row.reason}
        for row in unmeasured
    ]


def describe_unmeasured(entry: dict[str, Any]) -> str:
    rule = f" [{entry['rule']}]" if entry.get("rule") else ""
    return f"{entry['status']}{rule}" + (f": {entry['reason']}" if entry.get("reason") else "")


def unmeasured_everywhere(probes: list[ModelProbe]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """label -> [(model pass, entry)] for the labels (and full-recompute rows) that no probed model
    exercises: a full row one model refuses (MTP wants recompute_num_layers 1) and another measures
    is measured."""
    exercised = {
        row.label for probe in probes for row in single_label_rows(probe) if row.status == EFFECTIVE
    } | {
        row.label
        for probe in probes
        for row in probe.rows
        if row.fields.granularity == "full" and row.measured
    }
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for probe in probes:
        for entry in unmeasured_entries(probe):
            if entry["label"] not in exercised:
                found.setdefault(entry["label"], []).append((probe.pass_name, entry))
    return found
