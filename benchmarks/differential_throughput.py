"""Benchmark: differential-check throughput (matrix oracle + real validator, compared) against the raw
validator alone, on the same configurations (target: >= 25% of raw).

    ./venv-run python benchmarks/differential_throughput.py [--count 20000] [--repeat 3]

"Raw" constructs the real TransformerConfig / MLATransformerConfig for each configuration and
catches its rejection, nothing more. "Differential" is what ``matrix --check`` and the Hypothesis
tests do per configuration: build the fields, predict with the matrix, run the validator with
warning capture and rule classification, compare. Both runs see the same sampled configurations;
sampling itself is outside the timed region. Best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from harness.config.validate import BASE_MODEL, config_class_for
from harness.matrix.check import compare
from harness.matrix.oracle import Oracle
from harness.matrix.space import sample_scenarios

TARGET_RATIO = 0.25


def raw_rate(field_sets: list[dict]) -> float:
    kwargs = [{**BASE_MODEL, **fields} for fields in field_sets]
    classes = [config_class_for(item) for item in kwargs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        for config_class, item in zip(classes, kwargs):
            try:
                config_class(**item)
            except (AssertionError, ValueError):
                pass
        return len(kwargs) / (time.perf_counter() - started)


def differential_rate(oracle: Oracle, scenarios: list) -> tuple[float, int]:
    started = time.perf_counter()
    disagreements = sum(compare(oracle, scenario) is not None for scenario in scenarios)
    return len(scenarios) / (time.perf_counter() - started), disagreements


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    oracle = Oracle()
    scenarios = sample_scenarios(args.count, oracle.labels, seed=0)
    field_sets = [scenario.fields() for scenario in scenarios]
    raw_rate(field_sets[:500])  # warm-up: first-use imports and caches
    raw = max(raw_rate(field_sets) for _ in range(args.repeat))
    runs = [differential_rate(oracle, scenarios) for _ in range(args.repeat)]
    differential = max(rate for rate, _ in runs)
    ratio = differential / raw
    print(f"raw validator:             {raw:>9,.0f} configs/s")
    print(
        f"oracle + validator (diff): {differential:>9,.0f} configs/s  ({runs[0][1]} disagreements)"
    )
    print(
        f"ratio: {ratio:.0%} of raw (target >= {TARGET_RATIO:.0%}) over {args.count} configs, best of {args.repeat}"
    )
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
