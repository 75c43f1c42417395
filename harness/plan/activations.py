"""Per-layer activation bytes of every row, from the estimate's measurements of real MCore layers.

Source: the estimate of the recipe at the installed Megatron Core (``estimate --write-golden``'s
file: real layers at the recipe's per-rank widths, three short lengths, extrapolated exactly; written
by the harness with its provenance). Per layer kind and row: the bytes one layer retains for one
micro-batch (the estimate's stage totals divided by its layer count and in-flight micro-batches), and
the row's *transient*: what the rank's activation peak (MemTracker, forward and backward) adds on
top of the retained stage (``peak_bytes - retained_bytes``).

Rows the estimate cannot run on CPU are derived from Megatron Core's code, never fitted:

- ``moe_act`` where the estimate says requires-TE (a tree whose TE spec has no grouped linear for
  the adapter to stand in for; elsewhere the estimate measures it, ``TEGroupedMLP`` on the
  stand-ins): its ``CheckpointWithoutOutput`` discards the activation's output, the experts'
  ``linear_fc2`` input; the row is ``[]`` (or the row's other labels) minus those bytes, read from
  the control's attribution.
- full recompute (``TransformerBlock._checkpointed_forward``): a checkpointed group keeps only its
  input hidden state ``[s/tp, b, h]``; in backward it replays the group, whose ``[]`` bytes and
  transient are then alive (``uniform``: groups of N layers; ``block``: the first N layers of each
  model chunk one by one, the rest as ``[]``).
- a label none of the model's layer kinds has a checkpoint site for (``mlp`` on MoE-only layers,
  ``gdn_norm_out`` without Gated DeltaNet): ``[]``'s bytes, status ``inactive``.

A row neither measured nor derivable is ``unmeasured`` and names the estimate that measures it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from harness.config.fields import CONTROL_ROW, RecomputeFields
from harness.estimate.estimate import peak_moment
from harness.estimate.model import ATTENTION, DENSE, MAMBA, MLP, MOE
from harness.probe.measurement.status import REQUIRES_TE
from harness.record.metrics import MetricName

EXPERT_FC2 = "moe:mlp.experts.local_experts.*.linear_fc2"
TE_ONLY_LABELS = frozenset({"moe_act"})
# The labels whose checkpoint site each layer kind has (Megatron Core 0.19: TransformerLayer's norms,
# attention and MLP; MLA's up-projection; MoE's experts and shared experts; MambaLayer has none).
LABEL_SITES = {
    DENSE: frozenset({"core_attn", "mla_up_proj", "layernorm", "mlp"}),
    MOE: frozenset({"core_attn", "mla_up_proj", "layernorm", "moe", "moe_act", "shared_experts"}),
    ATTENTION: frozenset({"core_attn"}),
    MLP: frozenset({"mlp"}),
    MAMBA: frozenset(),
}


@dataclass
class RowActivations:
    """One row: bytes per layer of each kind for one micro-batch, and its transient."""

    label: str
    source: str  # measured / derived / inactive / rejected / unmeasured
    reason: str = ""
    rule: str | None = None
    per_layer: dict[str, Fraction] = field(default_factory=dict)
    transient: Fraction = Fraction(0)
    # full recompute: method and group size; None for selective rows
    full: tuple[str, int] | None = None
    # Where the rank's activation peak is (the estimate's ``peak_phase``): in backward (of layer
    # ``peak_layer`` of the stage; None: its last) or in forward. A row without a measured peak
    # takes the control's.
    peak_in_backward: bool = True
    peak_layer: int | None = None
    # The row whose checkpoints actually replay (None: this one): the row less the labels this
    # run's modules have no checkpoint for (``[]`` when none is left).
    replayed: str | None = None

    @property
    def usable(self) -> bool:
        return self.source in ("measured", "derived", "inactive")


@dataclass(frozen=True)
class LayerTable:
    """The estimate's per-layer bytes, keyed by canonical row name."""

    rows: dict[str, dict[str, Any]]
    layers: dict[str, int]
    in_flight: int
    provenance: dict[str, Any]

    @classmethod
    def from_estimate(cls, estimate: dict[str, Any]) -> LayerTable:
        rows = {RecomputeFields.parse(row["label"]).name: row for row in estimate["rows"]}
        return cls(
            rows,
            dict(estimate["layers"]),
            int(estimate["in_flight_microbatches"]),
            dict(estimate.get("provenance", {})),
        )

    def per_layer(self, row: dict[str, Any]) -> dict[str, Fraction] | None:
        kinds = row.get("per_kind") or {}
        if set(kinds) != set(self.layers):
            return None
        return {
            kind: Fraction(
                kinds[kind][MetricName.RETAINED_BYTES], self.layers[kind] * self.in_flight
            )
            for kind in self.layers
        }

    def peak(self, row: dict[str, Any]) -> tuple[bool, int | None]:
        """(in backward, layer) of the row's activation peak; (True, None) when not measured."""
        moment = peak_moment(row.get("peak_phase") or "")
        return (True, None) if moment is None else (moment[0] == "backward", moment[1])

    def transient(self, row: dict[str, Any]) -> Fraction | None:
        if row.get("peak_bytes") is None or row.get(MetricName.RETAINED_BYTES) is None:
            return None
        return Fraction(max(row["peak_bytes"] - row[MetricName.RETAINED_BYTES], 0))

    def linear_inputs_per_layer(self, row_name: str) -> dict[str, Fraction]:
        """Per layer kind, the bytes one layer keeps, for one micro-batch, in the inputs its
        matrix products save for backward (the modules ``linear_*``, experts' included): the
        control's attribution less what the row removes there."""
        control = self.rows[CONTROL_ROW]
        retained: dict[str, Fraction] = {
            name: Fraction(value) for name, value in (control.get("attribution") or {}).items()
        }
        row = self.rows.get(row_name, control)
        if row is not control:
            for entry in row.get("removed") or []:
                retained[entry["module"]] = (
                    retained.get(entry["module"], Fraction(0)) - entry["bytes"]
                )
        out = {kind: Fraction(0) for kind in self.layers}
        for name, value in retained.items():
            kind, _, path = name.partition(":")
            if kind in out and path.rsplit(".", 1)[-1].startswith("linear_"):
                out[kind] += value / (self.layers[kind] * self.in_flight)
        return out

    def expert_fc2_per_layer(self) -> Fraction:
        control = self.rows[RecomputeFields.parse(CONTROL_ROW).name]
        moe_layers = self.layers.get(MOE, 0)
        if not moe_layers:
            return Fraction(0)
        attributed = control.get("attribution", {}).get(EXPERT_FC2, 0)
        return Fraction(attributed, moe_layers * self.in_flight)


def with_fp8_linear_inputs(row: RowActivations, table: LayerTable) -> RowActivations:
    """``row`` under Transformer Engine's FP8 (delayed or current scaling): each linear quantizes
    its input to FP8 for its GEMM and saves that copy, one byte an element, for the weight
    gradient (``transformer_engine/pytorch/module/linear.py``: ``save_for_backward`` of the
    quantized input; ``layernorm_linear.py`` the same for the norm's output), where the bf16 run
    saves two; everything else a layer keeps (norm inputs, attention's q/k/v and output, the
    activation function's input) stays in bf16. So the bytes of the linear inputs the row retains
    are halved; its transient (a replay, the backward's own) is left as measured."""
    source = row.replayed or row.label
    if row.full is not None:
        source = CONTROL_ROW  # full recompute keeps the control's layers where it keeps any
    inputs = table.linear_inputs_per_layer(
        source if source in table.rows and table.rows[source].get("per_kind") else CONTROL_ROW
    )
    halved = {
        kind: value - inputs.get(kind, Fraction(0)) / 2 for kind, value in row.per_layer.items()
    }
    return dataclasses.replace(row, per_layer=halved)


def control_activations(table: LayerTable) -> RowActivations:
    control = table.rows[CONTROL_ROW]
    per_layer = table.per_layer(control)
    assert per_layer is not None, "the estimate's [] row has every layer kind"
    in_backward, layer = table.peak(control)
    return RowActivations(
        CONTROL_ROW,
        "measured",
        per_layer=per_layer,
        transient=table.transient(control) or Fraction(0),
        peak_in_backward=in_backward,
        peak_layer=layer,
    )


def row_activations(
    label: str,
    table: LayerTable,
    kinds: set[str],
    rejected: dict[str, tuple[str, str]],
    *,
    grouped_experts: bool,
) -> RowActivations:
    """The row's per-layer bytes: measured, derived from the code, or why not. ``grouped_experts``:
    the GPU run's experts are ``TEGroupedMLP`` (else ``SequentialMLP``, where ``moe_act`` has no
    checkpoint site)."""
    fields = RecomputeFields.parse(label)
    name = fields.name
    control = control_activations(table)
    if name in rejected:
        rule, message = rejected[name]
        return RowActivations(name, "rejected", message, rule)
    if name == CONTROL_ROW:
        return control
    te_only = set(fields.modules or ()) & TE_ONLY_LABELS
    if te_only and not grouped_experts:
        rest = [m for m in fields.modules or () if m not in TE_ONLY_LABELS]
        reason = (
            f"{'+'.join(sorted(te_only))}: this run's experts are SequentialMLP, which has no "
            "checkpoint for it (TEGroupedMLP only)"
        )
        if not rest:
            return RowActivations(
                name,
                "inactive",
                reason,
                per_layer=dict(control.per_layer),
                transient=control.transient,
                peak_in_backward=control.peak_in_backward,
                peak_layer=control.peak_layer,
                replayed=CONTROL_ROW,
            )
        active = row_activations(
            RecomputeFields.selective(*rest).name,
            table,
            kinds,
            rejected,
            grouped_experts=grouped_experts,
        )
        active.replayed = active.label
        active.label = name
        active.reason = "; ".join(filter(None, [reason, active.reason]))
        return active
    if fields.granularity == "full":
        return RowActivations(
            name,
            "derived",
            "full recompute: each checkpointed group keeps its input; backward replays the group",
            per_layer=dict(control.per_layer),
            transient=control.transient,
            full=(str(fields.method), int(fields.num_layers or 1)),
            peak_in_backward=control.peak_in_backward,
            peak_layer=control.peak_layer,
        )
    modules = set(fields.modules or ())
    sites = set().union(*(LABEL_SITES.get(kind, frozenset()) for kind in kinds))
    if not modules & sites:
        return RowActivations(
            name,
            "inactive",
            f"no layer kind of this model ({', '.join(sorted(kinds))}) has a checkpoint site for it",
            per_layer=dict(control.per_layer),
            transient=control.transient,
            peak_in_backward=control.peak_in_backward,
            peak_layer=control.peak_layer,
            replayed=CONTROL_ROW,
        )
    if modules - sites and name not in table.rows:
        # Labels no layer kind has a site for checkpoint nothing: the row is its other labels'.
        rest = [m for m in fields.modules or () if m in sites]
        active = row_activations(
            RecomputeFields.selective(*rest).name,
            table,
            kinds,
            rejected,
            grouped_experts=grouped_experts,
        )
        active.replayed = active.replayed or active.label
        active.label = name
        active.reason = "; ".join(
            filter(None, [f"{'+'.join(sorted(modules - sites))}: no site here", active.reason])
        )
        return active
    measured = table.rows.get(name)
    te_only = modules & TE_ONLY_LABELS
    if measured is not None:
        per_layer = table.per_layer(measured)
        # an estimate that built TEGroupedMLP (the adapter's grouped-linear stand-ins) measured
        # moe_act itself; one that could not says requires-TE, and the row is derived below
        unmeasured_te = measured.get("status") == REQUIRES_TE
        if per_layer is not None and not unmeasured_te:
            transient = table.transient(measured)
            if transient is None:  # no peaks measured (hybrid): a replay re-materialises its region
                transient = control.transient + max(
                    (control.per_layer[k] - per_layer[k] for k in per_layer), default=Fraction(0)
                )
            in_backward, layer = (
                table.peak(measured)
                if measured.get("peak_phase")
                else (control.peak_in_backward, control.peak_layer)
            )
            return RowActivations(
                name,
                "measured",
                per_layer=per_layer,
                transient=transient,
                peak_in_backward=in_backward,
                peak_layer=layer,
            )
        if te_only and (per_layer is not None or modules == te_only):
            base = per_layer if per_layer is not None else dict(control.per_layer)
            fc2 = table.expert_fc2_per_layer()
            derived = {k: v - fc2 if k == MOE else v for k, v in base.items()}
            return RowActivations(
                name,
                "derived",
                "moe_act: TEGroupedMLP's checkpoint discards the experts' linear_fc2 input "
                f"({float(fc2) / 1e6:.1f} MB a MoE layer, the control's attribution)",
                per_layer=derived,
                transient=control.transient + fc2,  # replayed in backward
                peak_in_backward=control.peak_in_backward,
                peak_layer=control.peak_layer,
            )
    return RowActivations(
        name,
        "unmeasured",
        f"no layer measurement of {name!r} at these pins: "
        f"recompute-harness estimate --recipe RECIPE --rows {name} --write-golden",
    )
