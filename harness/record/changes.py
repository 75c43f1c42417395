"""A probe value that changed, as a value (not a line of text): what a CPU golden's check and a tree
diff find, so a verdict block can name the first one and collapse the rest per label
(``harness.report.changes``). Imports neither torch nor Megatron Core."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.record.metrics import MetricName

# The value a row's status change is carried under (beside the metrics of ``MetricName``).
STATUS = "status"
# A label's unmeasured entry (rejected, inactive, requires-TE ... on the whole pass) changed: carried
# under this name, ``before`` / ``after`` the entry as the report describes it, or "measured".
UNMEASURED, MEASURED = "unmeasured", "measured"
# What "inactive" means (harness.probe.measurement.status): bytes, FLOPs and replayed bytes equal [].
ACTIVITY_METRICS = (
    MetricName.RETAINED_BYTES,
    MetricName.BACKWARD_FLOPS,
    MetricName.REPLAY_BYTES,
)


@dataclass(frozen=True)
class ValueChange:
    """One probe value of one row that differs: ``before`` the golden's (or tree A's), ``after`` this
    run's (tree B's). ``where`` names the pass (the model, with precision, back end and layout when
    they are not the default's); ``model`` the style model alone, to count models."""

    model: str
    where: str
    label: str
    metric: str
    before: Any
    after: Any

    def line(self) -> str:
        """``where: label: metric before -> after``: how a block names one changed value."""
        return f"{self.where}: {self.label}: {self.metric} {self.before} -> {self.after}"


def activity(values: Mapping[str, Any], control: Mapping[str, Any]) -> str:
    """``effective`` or ``inactive`` for a measured row's values against its ``[]`` control's, by the
    probe's own definition (the golden keeps values, not statuses)."""
    same = all(values.get(name) == control.get(name) for name in ACTIVITY_METRICS)
    return "inactive" if same else "effective"
