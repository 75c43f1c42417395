"""Differential check: the matrix's prediction against the real validator, scenario by scenario."""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.config.validate import Verdict, validate
from harness.matrix.oracle import Oracle, Prediction
from harness.matrix.space import Scenario


@dataclass(frozen=True)
class Disagreement:
    scenario: Scenario  # minimized: every dimension that can go back to baseline has
    predicted: Prediction
    actual: Verdict

    def report(self) -> str:
        def verdict(accepted: bool, rule: str | None, warned: tuple[str, ...]) -> str:
            text = "accept" if accepted else f"reject [{rule}]"
            return text + (f" warn {list(warned)}" if warned else "")

        predicted = verdict(self.predicted.accepted, self.predicted.rule, self.predicted.warning_rules)
        actual = verdict(self.actual.accepted, self.actual.rule, self.actual.warning_rules)
        if self.actual.message:
            actual += f": {self.actual.message}"
        return f"config: {self.scenario.describe()}\n  matrix predicts: {predicted}\n  MCore validator: {actual}"


def agrees(predicted: Prediction, actual: Verdict) -> bool:
    return (predicted.accepted, predicted.rule, predicted.warning_rules) == (
        actual.accepted,
        actual.rule,
        actual.warning_rules,
    )


def compare(oracle: Oracle, scenario: Scenario) -> Disagreement | None:
    fields = scenario.fields()
    predicted, actual = oracle.predict(fields), validate(fields)
    return None if agrees(predicted, actual) else Disagreement(scenario, predicted, actual)


def minimize(oracle: Oracle, found: Disagreement) -> Disagreement:
    """Greedily move dimensions back to baseline and drop labels while the disagreement persists."""
    current = found
    baseline = dict(Scenario.baseline().options)
    for index, (dimension, option) in enumerate(current.scenario.options):
        if option == baseline[dimension]:
            continue
        options = list(current.scenario.options)
        options[index] = (dimension, baseline[dimension])
        current = compare(oracle, replace(current.scenario, options=tuple(options))) or current
    modules = current.scenario.modules
    for label in list(modules or ()):
        shorter = list(current.scenario.modules)
        shorter.remove(label)
        current = compare(oracle, replace(current.scenario, modules=tuple(shorter))) or current
    return current


def check(scenarios: list[Scenario], oracle: Oracle) -> list[Disagreement]:
    """Minimized disagreements, one per distinct minimal config."""
    found: dict[Scenario, Disagreement] = {}
    for scenario in scenarios:
        disagreement = compare(oracle, scenario)
        if disagreement is not None:
            minimal = minimize(oracle, disagreement)
            found.setdefault(minimal.scenario, minimal)
    return list(found.values())

