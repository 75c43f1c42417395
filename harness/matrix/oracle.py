"""The matrix's prediction for a configuration: walk the validator rules in MCore's order."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.config.fields import RecomputeFields
from harness.config.labels import accepted_labels
from harness.config.revisions import collect_revisions
from harness.config.rule import Rule
from harness.config.rules import RULES
from harness.config.validate import BASE_MODEL, config_class_for, config_defaults
from harness.config.view import ConfigView

# Each with its predicate (the ones ``Rule.differential`` names), so the loop needs no None check.
_DIFFERENTIAL_RULES: tuple[tuple[Rule, Callable[[ConfigView], bool]], ...] = tuple(
    (rule, rule.predicate) for rule in RULES if rule.predicate is not None
)


@dataclass(frozen=True)
class Prediction:
    accepted: bool
    rule: str | None  # the first reject-rule that fires
    warning_rules: tuple[str, ...]  # warn-rules that fire before it
    effective: RecomputeFields | None  # recompute fields after post-init, when accepted


class Oracle:
    """Predicts the validator's verdict from the matrix alone (no MCore config is built)."""

    def __init__(self, labels: frozenset[str] | None = None, te_version: str | None = None) -> None:
        self.labels = accepted_labels() if labels is None else labels
        self.te_version = (
            collect_revisions()["transformer_engine"] if te_version is None else te_version
        )

    def predict(self, fields: Mapping[str, Any]) -> Prediction:
        full = {**BASE_MODEL, **fields}
        view = ConfigView(
            full, config_defaults(config_class_for(full)), self.labels, self.te_version
        )
        warned: list[str] = []
        for rule, predicate in _DIFFERENTIAL_RULES:
            if not predicate(view):
                continue
            if rule.outcome == "reject":
                return Prediction(False, rule.id, tuple(warned), None)
            if rule.outcome == "warn":
                warned.append(rule.id)
            if rule.rewrite is not None:
                view = view.with_fields(rule.rewrite(view))
        effective = RecomputeFields(
            view.granularity,
            tuple(view.modules),
            view["recompute_method"],
            view["recompute_num_layers"],
        )
        return Prediction(True, None, tuple(warned), effective)
