"""``recompute-harness matrix [--check]``: the compatibility matrix, or its differential check."""

from __future__ import annotations

import argparse
import json
import time

from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.config.rules import RULES, VALIDATOR, Rule
from harness.report.markdown import table

DEFAULT_CHECK_COUNT = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="compare the matrix with the real validator")
    parser.add_argument("--count", type=int, default=DEFAULT_CHECK_COUNT, help="configurations to check")
    parser.add_argument("--seed", type=int, default=0, help="seed of the configuration sample")
    parser.add_argument("--json", action="store_true", help="print the matrix (or the check's result) as JSON")


def _rule_json(rule: Rule) -> dict[str, object]:
    return {"id": rule.id, "reads": list(rule.reads), "condition": rule.condition, "outcome": str(rule.outcome),
            "enforced_in": rule.enforced_in, "source": rule.source, "differential": bool(rule.differential)}


def markdown_table() -> str:
    rows = []
    for rule in RULES:
        reads = ", ".join(f"`{field}`" for field in rule.reads)
        checked = "yes" if rule.differential else "no (unit tests)" if rule.enforced_in == VALIDATOR else "no"
        rows.append((f"`{rule.id}`", reads, rule.condition, rule.outcome, rule.enforced_in, rule.source, checked))
    return table(("id", "reads", "condition", "outcome", "enforced in", "source", "differential"), rows)


def run(args: argparse.Namespace) -> int:
    if not args.check:
        print(json.dumps([_rule_json(rule) for rule in RULES], indent=2) if args.json else markdown_table())
        return EXIT_OK
    if args.count <= 0:
        raise UsageError("--count must be positive")
    from harness.config.revisions import collect_revisions
    from harness.matrix.check import check
    from harness.matrix.oracle import Oracle
    from harness.matrix.space import sample_scenarios

    oracle = Oracle()
    scenarios = sample_scenarios(args.count, oracle.labels, seed=args.seed)
    started = time.perf_counter()
    disagreements = check(scenarios, oracle)
    elapsed = time.perf_counter() - started
    mcore = collect_revisions()["megatron_core"]
    if args.json:
        print(json.dumps({"checked": len(scenarios), "seed": args.seed, "megatron_core": mcore,
                          "elapsed_s": round(elapsed, 3),
                          "disagreements": [disagreement.report() for disagreement in disagreements]}, indent=2))
        return EXIT_FAILED if disagreements else EXIT_OK
    print(
        f"checked {len(scenarios)} configurations against megatron-core {mcore['version']} "
        f"(fingerprint {mcore['fingerprint']}) in {elapsed:.1f}s: {len(disagreements)} disagreements"
    )
    for disagreement in disagreements:
        print(disagreement.report())
    return EXIT_FAILED if disagreements else EXIT_OK
