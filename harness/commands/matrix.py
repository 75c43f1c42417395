"""``recompute-harness matrix [--check]``: the compatibility matrix, or its differential check."""

from __future__ import annotations

import argparse
import json
import time

from harness.config.rules import RULES, VALIDATOR, Rule
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.report.markdown import table

DEFAULT_CHECK_COUNT = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check", action="store_true", help="compare the matrix with the real validator"
    )
    parser.add_argument(
        "--count", type=int, default=DEFAULT_CHECK_COUNT, help="configurations to check"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the configuration sample")
    parser.add_argument(
        "--json", action="store_true", help="print the matrix (or the check's result) as JSON"
    )


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


def markdown_table() -> str:
    rows = []
    for rule in RULES:
        reads = ", ".join(f"`{field}`" for field in rule.reads)
        checked = (
            "yes"
            if rule.differential
            else "no (unit tests)"
            if rule.enforced_in == VALIDATOR
            else "no"
        )
        rows.append(
            (
                f"`{rule.id}`",
                reads,
                rule.condition,
                rule.outcome,
                rule.enforced_in,
                rule.source,
                checked,
            )
        )
    return table(
        ("id", "reads", "condition", "outcome", "enforced in", "source", "differential"), rows
    )


def run(args: argparse.Namespace) -> int:
    if not args.check:
        print(
            json.dumps([_rule_json(rule) for rule in RULES], indent=2)
            if args.json
            else markdown_table()
        )
        return EXIT_OK
    if args.count <= 0:
        raise UsageError("--count must be positive")
    lines, drifted, summary = drift_report(args.count, args.seed)
    print(json.dumps(summary, indent=2) if args.json else "\n".join(lines))
    return EXIT_FAILED if drifted else EXIT_OK


def drift_report(
    count: int = DEFAULT_CHECK_COUNT, seed: int = 0
) -> tuple[list[str], bool, dict[str, object]]:
    """The ``matrix --check`` report as lines, whether it found drift, and the same as JSON-ready data
    (the bump step reuses it)."""
    from harness.config.revisions import collect_revisions
    from harness.matrix.drift import (
        RULES_FILE,
        dead_rules,
        grouped_disagreements,
        labels_without_rules,
    )
    from harness.matrix.oracle import Oracle
    from harness.matrix.space import sample_scenarios

    oracle = Oracle()
    scenarios = sample_scenarios(count, oracle.labels, seed=seed)
    started = time.perf_counter()
    causes = grouped_disagreements(scenarios, oracle)
    dead = dead_rules()
    unruled = labels_without_rules(oracle.labels)
    elapsed = time.perf_counter() - started
    mcore = collect_revisions()["megatron_core"]
    total = sum(cause.count for cause in causes)
    summary = {
        "checked": len(scenarios),
        "seed": seed,
        "megatron_core": mcore,
        "elapsed_s": round(elapsed, 3),
        "disagreements": total,
        "causes": [cause.report() for cause in causes],
        "dead_rules": [rule.report() for rule in dead],
        "labels_without_rules": list(unruled),
    }
    lines = [
        (
            f"checked {len(scenarios)} configurations against megatron-core {mcore['version']} "
            f"(fingerprint {mcore['fingerprint']}) in {elapsed:.1f}s: {total} disagreements "
            f"({len(causes)} causes), {len(dead)} rules that can no longer fire, {len(unruled)} labels no rule names"
        )
    ]
    if dead:
        lines.append("rules that can no longer fire on this revision:")
        lines += [f"  {rule.report()}" for rule in dead]
    if unruled:
        lines.append(
            f"labels the validator accepts that no rule names: {', '.join(unruled)} (add the rules MCore "
            f"enforces for them to {RULES_FILE}; the probe lists labels no style model exercises)"
        )
    lines += [f"cause {number}: {cause.report()}" for number, cause in enumerate(causes, 1)]
    return lines, bool(causes or dead or unruled), summary
