"""What a label needs or does that no validator message says: the probe and ``validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LabelFacts:
    """What a label needs or does that no validator message says; the probe and ``validate`` read it."""

    # The only MCore class that implements the label, when that class is a Transformer Engine module
    # (without TE the validator still accepts the label and it does nothing), and where it is.
    te_class: str | None = None
    te_where: str | None = None
    rule: str | None = None  # the matrix rule documenting the fact
    # Why the label's gradients differ from []'s in the last bits while the loss is bit-identical.
    sum_order: str = ""


LABEL_FACTS: dict[str, LabelFacts] = {
    # In 0.19.2 ``moe_act`` is read only by TEGroupedMLP.__init__; without TE, grouped-GEMM experts are
    # built as SequentialMLP.
    "moe_act": LabelFacts(
        te_class="TEGroupedMLP",
        te_where="megatron/core/transformer/moe/experts.py",
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
