"""Which recompute configurations a probe measures on a model.

The control ``[]``, every label the installed validator accepts (read from it, never listed here),
the combinations from the skill's tables (harness/data/probe-combinations.json), and full recompute
with each method at the ``recompute_num_layers`` values derived from the model's depth
(harness/probe/sweep.py), again with ``skip_final_recompute`` where the revision has that field.
``--modules`` narrows that to the control plus the rows a user names: label sets (``a+b``) or full
recompute rows by their row name (``full-<method>-<n>[-skip-final]``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from harness.config.fields import SKIP_FINAL_FIELD, RecomputeFields, parse_labels, require_known
from harness.config.validate import config_has_field
from harness.probe.sweep import full_recompute_fields

CONTROL = RecomputeFields.selective()
# The parameter / activation precisions a probe pass runs in: fp32 (the bitwise verdicts are read
# there) and bf16 (what the GPU recipes keep; its bytes are its own golden).
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class ProbeRow:
    """One configuration to measure; ``add_bias_linear`` rows are the known-deadlock probe."""

    fields: RecomputeFields
    add_bias_linear: bool = False

    @property
    def label(self) -> str:
        return f"{self.fields.name} (bias)" if self.add_bias_linear else self.fields.name

    @property
    def may_hang(self) -> bool:
        """Selective ``mlp`` with biases deadlocks in ``CheckpointFunction.backward`` (0.19.2)."""
        return self.add_bias_linear


def _combinations_file() -> dict:
    return json.loads(
        resources.files("harness").joinpath("data/probe-combinations.json").read_text()
    )


def known_labels() -> frozenset[str]:
    from harness.config.labels import accepted_labels

    return accepted_labels()


def _is_full_row(spec: str) -> bool:
    # No recompute label starts so: labels are module names (core_attn, moe_act, ...).
    return spec.startswith("full-")


def parse_label_sets(specs: list[str]) -> list[tuple[str, ...]]:
    """``["core_attn", "layernorm+moe_act", "full-block-2"]`` -> label tuples (a full row is the
    one-element tuple of its name); unknown labels and misspelt full rows are a usage error."""
    known = known_labels()
    sets: list[tuple[str, ...]] = []
    for spec in specs:
        if _is_full_row(spec):
            RecomputeFields.parse(spec)  # its spelling: full-<method>-<n>[-skip-final]
            sets.append((spec,))
            continue
        labels = parse_labels(spec, "+", f"--modules {spec!r}")
        require_known(labels, known, f"--modules {spec!r}")
        sets.append(labels)
    return sets


def plan_rows(
    label_sets: list[tuple[str, ...]] | None = None, *, layers: int, hang_probe: bool = True
) -> list[ProbeRow]:
    """Rows in table order for a model of ``layers`` layers: control, singles, combinations, full
    (method x recompute_num_layers), then the deadlock probe."""
    rows = [ProbeRow(CONTROL)]
    if label_sets is not None:
        rows += [
            ProbeRow(
                RecomputeFields.parse(labels[0])
                if len(labels) == 1 and _is_full_row(labels[0])
                else RecomputeFields.selective(*labels)
            )
            for labels in label_sets
        ]
        return rows
    known = known_labels()
    data = _combinations_file()
    rows += [ProbeRow(RecomputeFields.selective(label)) for label in sorted(known)]
    rows += [
        ProbeRow(RecomputeFields.selective(*combo))
        for combo in data["combinations"]
        if all(label in known for label in combo)
    ]
    skip_final = config_has_field(SKIP_FINAL_FIELD)
    rows += [ProbeRow(fields) for fields in full_recompute_fields(layers, skip_final=skip_final)]
    if hang_probe and "mlp" in known:
        rows.append(ProbeRow(RecomputeFields.selective("mlp"), add_bias_linear=True))
    return rows
