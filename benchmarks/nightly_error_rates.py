"""The nightly step-time rule's error rates (issue 42): how often a night of no change fails, and how
often a real +5 % change of one row is caught, by rounds and by between-job noise.

Inputs: the landed H200 records (tests/measured/gpu-check-h200-20261204), each job's steady iterations
resampled with replacement after the warm-up ``steady_time`` finds (its warm-up kept), and every job
scaled by a simulated between-job factor ``exp(N(0, s))``, s = 0, 2, 5, 10 %. A golden of R rounds and a
night of R rounds are drawn independently; the night is judged by ``harness.record.step_time.decide``
against each row's repeats in both (``noise_from_repeats``; with one round, the golden's A/A rows:
``moe_act`` is inert on that image), exactly as ``compare`` judges a golden written from rounds.

- false alarm: a night of no change with any step-time test failed (all rows and the control's
  absolute time together: the family-wise rate, budget ``FAMILY_ALPHA`` = 1 %);
- power: one row (each in turn) made 5 % slower in every iteration, and that row's effect failed;
- rounds needed: the fewest R of the grid with false alarms <= 1 % and power >= 90 %; and, beyond
  the grid, the fewest R at which the rule's own ``detectable`` reaches +5 % for the noisiest row,
  from each row's per-round spread (400 simulated rounds).

``--iterations`` lengthens each job (more steady iterations drawn from the same ones): the other
lever against within-job noise. On the H200 one job of 20 iterations took about 21 s of wall time
(record timestamps 06:30:30 -> 06:31:54 for 5 jobs), so a round of 5 rows costs ~105 s.

    ./venv-run python benchmarks/nightly_error_rates.py            # 20 iterations per job
    ./venv-run python benchmarks/nightly_error_rates.py --iterations 100 --rounds 4 8 16
    ./venv-run python benchmarks/nightly_error_rates.py --landed-golden --nights 400
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from resampled_nights import (
    LANDED_GOLDEN,
    landed_json,
    landed_records,
    resampled_night,
    resampled_times,
)

from harness.record.step_time import (
    DETECTION_POWER,
    FAMILY_ALPHA,
    Noise,
    Spread,
    StepTimeRule,
    as_pct,
    decide,
    noise_from_equal_rows,
    noise_from_repeats,
    round_effect,
    steady_time,
    welch_df,
)

CONTROL = "[]"
INERT = "moe_act"  # SequentialMLP experts ignore it on the landed image (harness.golden.judge.does_nothing)
NOISE_LEVELS = (0.0, 0.02, 0.05, 0.10)
ROUNDS = (1, 2, 4, 8, 16)
CHANGE = 1.05


def _jobs() -> dict[str, tuple[list[float], int]]:
    """label -> (its landed iterations, its first steady iteration)."""
    jobs = {}
    for record in landed_records():
        times = [float(row.step_time_ms or 0.0) for row in record.run_metrics.iterations]
        jobs[record.label] = (times, steady_time(times).warmup + 1)
    return jobs


def _rounds(
    jobs: dict[str, tuple[list[float], int]],
    rounds: int,
    between_job: float,
    rng: random.Random,
    iterations: int,
    slower: str | None = None,
) -> dict[str, list[float]]:
    """label -> each round's steady median, as ``compare`` reads a sweep in rounds."""
    series: dict[str, list[float]] = {label: [] for label in jobs}
    for _ in range(rounds):
        for label, (times, first) in jobs.items():
            factor = math.exp(rng.gauss(0.0, between_job)) * (CHANGE if label == slower else 1.0)
            rerun = resampled_times(times, first, rng, factor, iterations)
            series[label].append(steady_time(rerun).median_ms)
    return series


def _night_fails(
    golden: dict[str, list[float]], night: dict[str, list[float]], row: str | None
) -> bool:
    """Whether the night fails (``row`` None: any test) or names ``row`` slower."""
    control = golden[CONTROL]
    noise = (
        noise_from_repeats([golden, night], "repeats")
        if len(control) > 1
        else noise_from_equal_rows({INERT: round_effect(golden[INERT], control)}, list(golden))
    )
    assert noise is not None
    _, decisions = decide(golden, night, CONTROL, noise)
    if row is None:
        return not all(decision.passed for decision in decisions.values())
    return not decisions[row].passed and decisions[row].change > 0


def predicted_rounds(
    jobs: dict[str, tuple[list[float], int]], between_job: float, iterations: int, seed: int
) -> tuple[int | None, dict[str, float]]:
    """The fewest rounds at which the rule's own ``detectable`` reaches the change for the noisiest
    row, from each row's per-round spread measured over 400 simulated rounds (the simulation checks
    it where it is affordable); and those spreads, in percent."""
    long = _rounds(jobs, 400, between_job, random.Random(seed), iterations)
    spread = {label: statistics.stdev(math.log(t) for t in times) for label, times in long.items()}
    noise = Noise({label: Spread(sd, 399) for label, sd in spread.items()}, "sim", known=False)
    for rounds in range(2, 2001):
        rule = StepTimeRule(noise, len(jobs), rounds, rounds)
        base = Spread(spread[CONTROL], 2 * (rounds - 1))
        worst = max(
            rule.detectable(
                Spread(
                    math.sqrt(sd**2 + base.sd**2),
                    welch_df((Spread(sd, 2 * (rounds - 1)), base)),
                )
            )
            for label, sd in spread.items()
            if label != CONTROL
        )
        if worst <= math.log(CHANGE):
            return rounds, {label: 100 * sd for label, sd in spread.items()}
    return None, {label: 100 * sd for label, sd in spread.items()}


def measure(
    rounds: int, between_job: float, nights: int, iterations: int, seed: int
) -> dict[str, float]:
    rng = random.Random(seed)
    jobs = _jobs()
    rows = [label for label in jobs if label != CONTROL]
    false_alarms = sum(
        _night_fails(
            _rounds(jobs, rounds, between_job, rng, iterations),
            _rounds(jobs, rounds, between_job, rng, iterations),
            None,
        )
        for _ in range(nights)
    )
    caught = 0
    for night in range(nights):
        row = rows[night % len(rows)]
        caught += _night_fails(
            _rounds(jobs, rounds, between_job, rng, iterations),
            _rounds(jobs, rounds, between_job, rng, iterations, slower=row),
            row,
        )
    return {"false_alarm": false_alarms / nights, "power": caught / nights}


def landed_golden_nights(between_job: float, nights: int, seed: int) -> dict[str, float]:
    """The issue's "done when" setting through the real comparator: the landed one-round golden
    against reruns in today's single-job format; false alarms, and each row 30 % slower named."""
    from harness.golden.judge import compare_records
    from harness.golden.store import load_golden
    from harness.record.metrics import MetricName

    golden, landed, rng = load_golden(LANDED_GOLDEN), landed_json(), random.Random(seed)
    judged = str(LANDED_GOLDEN)
    found = {
        "false_alarm": sum(
            not compare_records(golden, resampled_night(landed, rng, between_job), judged).passed
            for _ in range(nights)
        )
        / nights
    }
    for row in ("core_attn", "mla_up_proj", "moe", "moe_act"):
        named = 0
        for _ in range(nights):
            night = resampled_night(landed, rng, between_job, slower={row: 1.3})
            named += any(
                (check.label, check.metric) == (row, MetricName.STEP_TIME_COST_PCT)
                for check in compare_records(golden, night, judged).failures
            )
        found[row] = named / nights
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nights", type=int, default=200, help="simulated nights per cell")
    parser.add_argument(
        "--rounds", type=int, nargs="+", default=list(ROUNDS), help="round counts to try"
    )
    parser.add_argument("--iterations", type=int, default=20, help="iterations per job")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="also write the table here")
    parser.add_argument(
        "--landed-golden",
        action="store_true",
        help="instead: the landed one-round H200 golden against single-job reruns, a row 30 %% slower",
    )
    args = parser.parse_args()
    if args.landed_golden:
        for between_job in NOISE_LEVELS:
            found = landed_golden_nights(between_job, args.nights, args.seed)
            shown = ", ".join(
                f"{row} {rate:.1%}" for row, rate in found.items() if row != "false_alarm"
            )
            print(
                f"landed golden, between-job {between_job:4.0%}: false alarms "
                f"{found['false_alarm']:.1%}; 30 % slower named: {shown}",
                flush=True,
            )
        return
    print(
        f"{args.iterations} iterations per job, {args.nights} nights per cell, family-wise budget "
        f"{FAMILY_ALPHA:.0%}, power at +{as_pct(math.log(CHANGE)):.0f} % of one row "
        f"(target {DETECTION_POWER:.0%})"
    )
    table = []
    for between_job in NOISE_LEVELS:
        needed = None
        for rounds in args.rounds:
            found = measure(rounds, between_job, args.nights, args.iterations, args.seed)
            table.append({"between_job": between_job, "rounds": rounds, **found})
            print(
                f"between-job {between_job:4.0%}  rounds {rounds:2d}  false alarms "
                f"{found['false_alarm']:6.1%}  power {found['power']:6.1%}",
                flush=True,
            )
            if (
                needed is None
                and found["false_alarm"] <= FAMILY_ALPHA
                and found["power"] >= DETECTION_POWER
            ):
                needed = rounds
        predicted, spreads = predicted_rounds(_jobs(), between_job, args.iterations, args.seed)
        shown = ", ".join(f"{label} {sd:.1f} %" for label, sd in spreads.items())
        print(
            f"between-job {between_job:4.0%}: rounds needed, simulated "
            f"{needed if needed is not None else f'> {args.rounds[-1]}'}; predicted by the rule "
            f"{predicted} (per-round spread: {shown})",
            flush=True,
        )
        table.append({"between_job": between_job, "predicted_rounds": predicted, **spreads})
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
