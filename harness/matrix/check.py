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
        def verdict(result: Prediction | Verdict) -> str:
            text = (
                f"accept as {result.effective.as_dict()}"
                if result.accepted and result.effective is not None
                else f"reject [{result.rule}]"
            )
            return text + (f" warn {list(result.warning_rules)}" if result.warning_rules else "")

        predicted, actual = verdict(self.predicted), verdict(self.actual)
        if self.actual.message:
            actual += f": {self.actual.message}"
        return f"config: {self.scenario.describe()}\n  matrix predicts: {predicted}\n  MCore validator: {actual}"


def agrees(predicted: Prediction, actual: Verdict) -> bool:
    return (predicted.accepted, predicted.rule, predicted.warning_rules, predicted.effective) == (
        actual.accepted,
        actual.rule,
        actual.warning_rules,
        actual.effective,
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
        shorter = list(current.scenario.modules or ())
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
