"""What a label needs or does that no validator message says: the probe and ``validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass

from harness.config.labels import accepted_labels


@dataclass(frozen=True)
class LabelFacts:
    """What a label needs or does that no validator message says; the probe and ``validate`` read it."""

    # The only MCore class that implements the label, when that class is a Transformer Engine module
    # (without TE the validator still accepts the label and it does nothing), and where it is.
    te_class: str | None = None
    te_where: str | None = None
    # The submodule (attribute name) that ``te_class`` is built as: a model or layer without one has
    # no site for the label at all (a dense layer for ``moe_act``), which no TE would change.
    te_site: str | None = None
    rule: str | None = None  # the matrix rule documenting the fact
    # Why the label's gradients differ from []'s in the last bits while the loss is bit-identical.
    sum_order: str = ""


LABEL_FACTS: dict[str, LabelFacts] = {
    # In 0.19.2 ``moe_act`` is read only by TEGroupedMLP.__init__; without TE, MCore's specs build
    # grouped-GEMM experts as SequentialMLP (on CPU the style models build TEGroupedMLP over the
    # adapter's grouped-linear stand-ins, harness.cpu.grouped_linear).
    "moe_act": LabelFacts(
        te_class="TEGroupedMLP",
        te_where="megatron/core/transformer/moe/experts.py",
        te_site="experts",
        rule="semantics.moe_act-needs-te-grouped-mlp",
    ),
    # ``layernorm`` (measured on 0.19.2, local spec, torch.nn.RMSNorm): the norm's input x feeds the
    # residual add (gradient r) and, inside RMSNorm's composite backward, two paths (x * rsqrt: a, and
    # x.pow(2): b). Without recompute autograd adds them in arrival order, (r + a) + b. Under
    # CheckpointWithoutOutput the nested ``torch.autograd.backward`` sums a + b first and returns one
    # gradient, so the sum is r + (a + b): fp32 rounding differs. A control whose norms only sit behind
    # a nested backward (no recompute) matches the row bit for bit: tests/unit/probe/measurement/test_status.py.
    "layernorm": LabelFacts(
        sum_order=(
            "fp32 sum order only: CheckpointWithoutOutput's nested backward pre-sums the norm-input gradient, "
            "so the residual's is added as r+(a+b), not (r+a)+b"
        )
    ),
}


# Which of Megatron Core's checkpoint classes each label's recompute runs through (0.18.2 to the
# head: ``tensor_parallel.checkpoint`` is CheckpointFunction; the output-discard sites build
# CheckpointWithoutOutput). Full recompute (recompute.py) runs through CheckpointFunction too.
CHECKPOINT_LABELS: dict[str, tuple[str, ...]] = {
    "CheckpointFunction": ("core_attn", "mlp", "moe", "shared_experts", "full recompute"),
    "CheckpointWithoutOutput": (
        "layernorm",
        "mla_up_proj",
        "moe_act",
        "gdn_norm_out",
        "gdp_in_proj",
        "gdp_qkv",
    ),
}


def labels_relying_on(checkpoint: str) -> tuple[str, ...]:
    """The labels (and ``full recompute``) whose recompute runs through ``checkpoint``, among those
    the installed validator accepts."""
    known = accepted_labels()
    return tuple(
        label
        for label in CHECKPOINT_LABELS[checkpoint]
        if label == "full recompute" or label in known
    )
