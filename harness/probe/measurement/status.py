"""Verdicts on one probe row: numerical equivalence with the control, and what the label did.

Statuses (the ``[]`` row itself is ``control``):
- ``effective``   accepted, and retained bytes or replay work differ from ``[]``;
- ``inactive``    accepted, and bytes, FLOPs and replayed bytes all equal ``[]``'s;
- ``requires-TE`` accepted, but a label's implementation exists only in Transformer Engine modules
                  that this build does not have, so the label is silently ignored;
- ``rejected``    the real validator refused the configuration (with the matrix rule id);
- ``hang``        the isolated probe did not finish before its timeout, or its reentrant backward
                  kept starting threads (harness.probe.workers.isolate; process group killed);
- ``crash``       the isolated probe died without a result;
- ``error``       building or measuring the row (or its model's ``[]`` control) raised, also where the
                  validator accepted the configuration and Megatron Core raised while it ran
                  (Megatron-LM #3562: uniform recompute indexed past the last layer); the reason is the
                  exception's line, and the rest of the probe goes on (exit 1);
- ``requires-CUDA`` Megatron Core raised from torch.cuda on an accepted configuration (the alltoall
                  dispatcher's CUDA stream): the CPU cannot run it, the reason says where.

Importing this module does not import torch: the isolated-probe parent uses the statuses too.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.config.label_facts import LABEL_FACTS

if TYPE_CHECKING:
    import torch

CONTROL_STATUS = "control"
EFFECTIVE, INACTIVE, REQUIRES_TE, REJECTED = "effective", "inactive", "requires-TE", "rejected"
HANG, CRASH, ERROR = "hang", "crash", "error"
# A configuration the installed Megatron Core needs CUDA for (tried on CPU: the exception says why).
REQUIRES_CUDA = "requires-CUDA"


def exception_line(exc: BaseException) -> str:
    """``Type: first line of the message``: what a row that raised records as its reason."""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__


@dataclass
class MeasuredRow:
    """One recompute row measured against ``[]`` and its verdict: the result type the probe
    (``harness.probe.runner.ProbeRowResult``) and the estimate (``harness.estimate.estimate.EstimateRow``)
    share. ``status`` is one of this module's statuses; ``rule`` the matrix rule of a rejection."""

    label: str
    status: str
    reason: str = ""
    rule: str | None = None
    retained_bytes: int | None = None

    @property
    def measured(self) -> bool:
        return self.retained_bytes is not None


@dataclass(frozen=True)
class Equivalence:
    """Loss and parameter gradients of a row against the control's, bit for bit."""

    loss_equal: bool
    differing_grads: int
    max_abs_grad_diff: float

    @property
    def bitwise(self) -> bool:
        return self.loss_equal and self.differing_grads == 0

    @property
    def summary(self) -> str:
        if self.bitwise:
            return "bitwise"
        loss = "" if self.loss_equal else "loss≠ "
        return f"{loss}{self.differing_grads} grads≠ (max |Δ| {self.max_abs_grad_diff:.1e})"


def compare_numerics(
    loss: torch.Tensor,
    grads: dict[str, torch.Tensor],
    control_loss: torch.Tensor,
    control_grads: dict[str, torch.Tensor],
) -> Equivalence:
    import torch

    names = sorted(set(grads) | set(control_grads))
    differing, max_diff = 0, 0.0
    for name in names:
        mine, theirs = grads.get(name), control_grads.get(name)
        if mine is None or theirs is None or mine.shape != theirs.shape:
            differing += 1
            max_diff = float("inf")
            continue
        if not torch.equal(mine, theirs):
            differing += 1
            max_diff = max(max_diff, (mine - theirs).abs().max().item())
    return Equivalence(bool(torch.equal(loss, control_loss)), differing, max_diff)


def sum_order_reason(labels: tuple[str, ...], equivalence: Equivalence) -> str:
    """The known sum-order cause of grads-only differences for ``labels`` ("" when bitwise or unexplained)."""
    if equivalence.bitwise or not equivalence.loss_equal:
        return ""
    return "; ".join(
        f"{label}: {LABEL_FACTS[label].sum_order}"
        for label in labels
        if label in LABEL_FACTS and LABEL_FACTS[label].sum_order
    )


def te_only_labels_missing(
    labels: tuple[str, ...], model: torch.nn.Module, have_te: bool
) -> list[str]:
    """Labels in ``labels`` whose only implementation is a TE class absent from ``model``, where the
    model has the label's site (``LabelFacts.te_site``): without one the label has nothing to act on."""
    if have_te:
        return []
    present = {type(module).__name__ for module in model.modules()}
    sites = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    return [
        label
        for label in labels
        if label in LABEL_FACTS
        and LABEL_FACTS[label].te_class not in (None, *present)
        and LABEL_FACTS[label].te_site in (None, *sites)
    ]


def requires_te_reason(missing: list[str], model: torch.nn.Module) -> str:
    experts = sorted(
        {type(m).__name__ for name, m in model.named_modules() if name.endswith(".experts")}
    )
    parts = [
        f"{label} recompute exists only in {LABEL_FACTS[label].te_class} ({LABEL_FACTS[label].te_where}); "
        f"without Transformer Engine the experts are {'/'.join(experts) or 'absent'}, so the validator "
        f"accepts {label} and it does nothing"
        for label in missing
    ]
    return "; ".join(parts)


def failure_status(exc: BaseException) -> tuple[str, str]:
    """(status, reason) for what Megatron Core raised on a configuration the validator accepted:
    ``requires-CUDA`` when torch.cuda raised it, else ``error``; the reason names the exception and
    the innermost Megatron Core line on the way (the call that needed CUDA)."""
    frames = traceback.extract_tb(exc.__traceback__)
    cuda = any("/torch/cuda/" in frame.filename for frame in frames)
    caller = next(
        (
            f"megatron/{frame.filename.split('/megatron/')[-1]}:{frame.lineno} {frame.line}"
            for frame in reversed(frames)
            if "/megatron/core/" in frame.filename
        ),
        "",
    )
    reason = exception_line(exc) + (f" ({caller})" if caller else "")
    return (REQUIRES_CUDA if cuda else ERROR), reason
