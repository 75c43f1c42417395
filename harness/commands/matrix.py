"""``recompute-harness matrix [--check]``: the compatibility matrix, or its differential check."""

from __future__ import annotations

import argparse
import time

from harness.errors import EXIT_FAILED, EXIT_OK, UsageError
from harness.config.rules import RULES, VALIDATOR
from harness.report.markdown import table

DEFAULT_CHECK_COUNT = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="compare the matrix with the real validator")
    parser.add_argument("--count", type=int, default=DEFAULT_CHECK_COUNT, help="configurations to check")
    parser.add_argument("--seed", type=int, default=0, help="seed of the configuration sample")


def markdown_table() -> str:
    rows = []
    for rule in RULES:
        reads = ", ".join(f"`{field}`" for field in rule.reads)
        checked = "yes" if rule.differential else "no (unit tests)" if rule.enforced_in == VALIDATOR else "no"
        rows.append((f"`{rule.id}`", reads, rule.condition, rule.outcome, rule.enforced_in, rule.source, checked))
    return table(("id", "reads", "condition", "outcome", "enforced in", "source", "differential"), rows)


def run(args: argparse.Namespace) -> int:
    if not args.check:
        print(markdown_table())
        return EXIT_OK
    if args.count <= 0:
        raise UsageError("--count must be positive")
    lines, drifted = drift_report(args.count, args.seed)
    print("\n".join(lines))
    return EXIT_FAILED if drifted else EXIT_OK


def drift_report(count: int = DEFAULT_CHECK_COUNT, seed: int = 0) -> tuple[list[str], bool]:
    """The ``matrix --check`` report as lines, and whether it found drift (the bump step reuses it)."""
    from harness.config.revisions import collect_revisions
    from harness.matrix.drift import RULES_FILE, dead_rules, grouped_disagreements, labels_without_rules
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
    lines = [
        f"checked {len(scenarios)} configurations against megatron-core {mcore['version']} "
        f"(fingerprint {mcore['fingerprint']}) in {elapsed:.1f}s: {total} disagreements "
        f"({len(causes)} causes), {len(dead)} rules that can no longer fire, {len(unruled)} labels no rule names"
    ]
    if dead:
        lines.append("rules that can no longer fire on this revision:")
        lines += [f"  {rule.report()}" for rule in dead]
    if unruled:
        lines.append(f"labels the validator accepts that no rule names: {', '.join(unruled)} (add the rules MCore "
                     f"enforces for them to {RULES_FILE}; the probe lists labels no style model exercises)")
    lines += [f"cause {number}: {cause.report()}" for number, cause in enumerate(causes, 1)]
    return lines, bool(causes or dead or unruled)
