"""Machine-readable reports: the same content as the markdown tables, as JSON (never NaN)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from harness.compare.analysis import Analysis
from harness.compare.selection import Selection
from harness.config.rule import Rule
from harness.config.rules import RULES
from harness.golden.judge import Comparison


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    return {
        "golden": comparison.golden_path,
        "recipe": comparison.recipe,
        "passed": comparison.passed,
        "effect_only": comparison.effect_only,
        "checks": [asdict(check) for check in comparison.checks],
    }


def analysis_json(analysis: Analysis) -> dict[str, Any]:
    return analysis.as_dict()


def selection_json(selection: Selection) -> dict[str, Any]:
    data = asdict(selection)
    data["considered"] = [
        {"label": label, "reason": reason} for label, reason in selection.considered
    ]
    return data


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False)


def _rule_json(rule: Rule) -> dict[str, object]:
    return {
        "id": rule.id,
        "reads": list(rule.reads),
        "condition": rule.condition,
        "outcome": str(rule.outcome),
        "enforced_in": rule.enforced_in,
        "source": rule.source,
        "differential": bool(rule.differential),
    }


def matrix_json() -> list[dict[str, object]]:
    """Every rule as JSON (``matrix --json``)."""
    return [_rule_json(rule) for rule in RULES]
