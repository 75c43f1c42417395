"""Step time in rounds, judged against measured noise (issue 42; docs/goldens.md, "Step time").

One job's step times are not one number: the series warms up (compilation, the allocator, clocks),
then jitters. And two jobs of the same work differ by more than the jitter inside one: each process
has a performance of its own. So a row's step time is measured in *rounds* (every row once per round,
in rotated order) and read here:

- ``steady_time``: where warm-up ends, found from the series itself (the first block of iterations
  whose median is no longer above the median of what follows), and the median of what is left;
- ``round_effect``: a row's effect, the mean over rounds of ``log(row / [] of the same round)``, with
  its standard error when there are several rounds;
- ``Noise``: each row's own job-to-job spread of log steady times, from repeated rounds (the
  golden's and tonight's), or, for a golden of one round, a known between-job term from its rows that
  must equal ``[]`` (a label Megatron Core accepts and ignores on that stack:
  ``harness.golden.judge.does_nothing``);
- ``StepTimeRule`` and ``decide``: every step-time test of a night (each row's effect, the control's
  absolute time) shares one false-alarm budget (``FAMILY_ALPHA``, Bonferroni); a difference beyond
  ``q * sd * sqrt(1/N + 1/G)`` fails (N rounds tonight, G in the golden; q normal for a known noise,
  Student's t at the estimate's degrees of freedom otherwise), and the change it would catch nine
  times in ten is stated beside it (``detectable``);
- ``calibration``: what a sweep in rounds says about its own noise (``recompute-harness noise``).

Times are compared as logs: a ratio of step times is what a recompute changes, and a job's speed
multiplies every iteration.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.record.model import Record

# A night of no change fails at most this often, all its step-time tests together.
FAMILY_ALPHA = 0.01
# The power ``detectable`` is stated at: the smallest change caught nine nights in ten.
DETECTION_POWER = 0.9
# Warm-up: a block of this many iterations is compared with the median of everything after it ...
WARMUP_BLOCK = 5
# ... and has stopped falling once its median is within this fraction of that median, or within the
# median absolute deviation of what follows, whichever is wider (a jittery series settles sooner).
WARMUP_SLACK = 0.02
# At least this many steady iterations are kept, settled or not.
MIN_STEADY = 5
# The record's ``workload.extra`` key of the round a job ran in (1-based); absent: one job per row.
ROUND_KEY = "round"


@dataclass(frozen=True)
class SteadyTime:
    """One job's steady step time: the iterations its warm-up took, and the median of the rest."""

    warmup: int  # iterations dropped from the start of the series
    steady: int  # iterations the median is taken over
    median_ms: float
    # False: the series was still falling at its end; the last MIN_STEADY iterations were taken.
    settled: bool


def steady_time(times_ms: Sequence[float]) -> SteadyTime:
    """Find the end of warm-up in ``times_ms`` (one job's iterations in order) and take the median
    after it. The first iteration (compilation, first allocations) is always warm-up."""
    if len(times_ms) < MIN_STEADY + 1:
        raise ValueError(
            f"{len(times_ms)} iterations: a steady time needs at least {MIN_STEADY + 1}"
        )
    last_start = len(times_ms) - MIN_STEADY
    for start in range(1, last_start + 1):
        block = times_ms[start : start + WARMUP_BLOCK]
        after = times_ms[start + WARMUP_BLOCK :]
        if not after:
            break
        level = statistics.median(after)
        # Within the jitter of what follows (its median absolute deviation), a block is no higher.
        jitter = statistics.median(abs(time - level) for time in after)
        if statistics.median(block) <= level + max(WARMUP_SLACK * level, jitter):
            return _steady(times_ms, start, settled=True)
    return _steady(times_ms, last_start, settled=False)


def round_index(record: Record) -> int:
    """The round ``record``'s job ran in: 1 for a sweep of one job per row."""
    return int(record.workload.extra.get(ROUND_KEY, "1"))


def in_round(record: Record, round_number: int) -> Record:
    """``record`` marked as the job of round ``round_number``."""
    workload = replace(
        record.workload, extra={**record.workload.extra, ROUND_KEY: str(round_number)}
    )
    return replace(record, workload=workload)


def in_rounds(record: Record) -> bool:
    """Whether ``record`` was measured as one round of several (``run --rounds``)."""
    return ROUND_KEY in record.workload.extra


def by_round(records: Sequence[Record]) -> dict[str, list[Record]]:
    """label -> that row's records in round order (one each for a sweep of one job per row)."""
    grouped: dict[str, list[Record]] = {}
    for record in sorted(records, key=round_index):
        grouped.setdefault(record.label, []).append(record)
    return grouped


def first_round(records: Sequence[Record]) -> list[Record]:
    """The records of the first round each row ran in: what memory, counts and outcomes are read
    from (they do not change between rounds of the same work)."""
    return [rounds[0] for rounds in by_round(records).values()]


def timed_iterations(record: Record) -> list[float]:
    """``record``'s step times in order, skipped and NaN iterations left out."""
    return [
        row.step_time_ms
        for row in record.run_metrics.iterations
        if row.step_time_ms is not None and not row.skipped and not row.nan
    ]


def record_steady_time(record: Record) -> SteadyTime | None:
    """The steady time of ``record``'s job; None when it did not time enough iterations."""
    times = timed_iterations(record)
    return steady_time(times) if len(times) > MIN_STEADY else None


def _steady(times_ms: Sequence[float], start: int, *, settled: bool) -> SteadyTime:
    kept = times_ms[start:]
    return SteadyTime(start, len(kept), float(statistics.median(kept)), settled)


@dataclass(frozen=True)
class RoundEffect:
    """A row's step-time effect against the control over rounds, in log units."""

    log_ratios: tuple[float, ...]  # one per round: log(row / control of the same round)

    @property
    def rounds(self) -> int:
        return len(self.log_ratios)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.log_ratios)

    @property
    def standard_error(self) -> float | None:
        """None with one round: nothing to measure a spread from."""
        if self.rounds < 2:
            return None
        return statistics.stdev(self.log_ratios) / math.sqrt(self.rounds)

    @property
    def pct(self) -> float:
        return as_pct(self.mean)

    def interval_pct(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """The effect's confidence interval in percent (Student's t at rounds - 1 df); None with one
        round."""
        if self.standard_error is None:
            return None
        half = t_quantile((1 + confidence) / 2, self.rounds - 1) * self.standard_error
        return as_pct(self.mean - half), as_pct(self.mean + half)


def round_effect(row_ms: Sequence[float], control_ms: Sequence[float]) -> RoundEffect:
    """``row_ms[i]`` and ``control_ms[i]`` are the steady times of round ``i``."""
    if len(row_ms) != len(control_ms) or not row_ms:
        raise ValueError(f"{len(row_ms)} rounds of the row, {len(control_ms)} of the control")
    return RoundEffect(tuple(math.log(r / c) for r, c in zip(row_ms, control_ms)))


def as_pct(log_value: float) -> float:
    """A log ratio as a percent change."""
    return (math.exp(log_value) - 1.0) * 100.0


@dataclass(frozen=True)
class Spread:
    """The standard deviation of one job's log steady time, and the degrees of freedom behind it."""

    sd: float
    df: int


@dataclass(frozen=True)
class Noise:
    """What a night's step times are judged against: each row's own job-to-job spread (the control's
    under its label), which holds the within-job jitter of a round's median and the between-job
    difference of processes."""

    rows: dict[str, Spread]
    source: str  # where it was measured, in words
    # True: a term measured elsewhere and taken as known (normal quantiles); False: estimated from
    # repeats (Student's t at its degrees of freedom, as few repeats earn).
    known: bool


def noise_from_repeats(rounds_ms: Sequence[dict[str, list[float]]], source: str) -> Noise | None:
    """Each row's spread of log steady times about its mean, pooled over the sets given (the golden's
    rounds and, under the hypothesis of no change, tonight's: a constant change moves the mean, not
    the spread). Rows are not pooled with each other: the control is often the noisiest, and every
    effect shares its noise. None when no row has two rounds in any set."""
    squares: dict[str, float] = {}
    df: dict[str, int] = {}
    for rows in rounds_ms:
        for label, times in rows.items():
            if len(times) < 2:
                continue
            logs = [math.log(time) for time in times]
            centre = statistics.fmean(logs)
            squares[label] = squares.get(label, 0.0) + sum((x - centre) ** 2 for x in logs)
            df[label] = df.get(label, 0) + len(logs) - 1
    if not df:
        return None
    return Noise(
        {label: Spread(math.sqrt(squares[label] / df[label]), df[label]) for label in df},
        source,
        known=False,
    )


def noise_from_equal_rows(pairs: dict[str, RoundEffect], labels: Sequence[str]) -> Noise | None:
    """The spread of rows that must equal the control (``pairs``: label -> its effect), each round an
    A/A pair whose true log-ratio is zero: the root mean square of every such log-ratio is a pair's
    spread, one job's is that over sqrt 2; taken as a known between-job term for every row of
    ``labels``."""
    values = [d for effect in pairs.values() for d in effect.log_ratios]
    if not values:
        return None
    job = Spread(math.sqrt(statistics.fmean(d * d for d in values)) / math.sqrt(2), len(values))
    return Noise(
        {label: job for label in labels},
        f"A/A rows {' = '.join(['[]', *sorted(pairs)])}",
        known=True,
    )


def welch_df(parts: Sequence[Spread]) -> int:
    """Welch-Satterthwaite: the degrees of freedom of a sum of the variances ``parts``."""
    total = sum(part.sd**2 for part in parts)
    spread = sum(part.sd**4 / part.df for part in parts)
    return max(1, int(total**2 / spread)) if spread > 0 else min(part.df for part in parts)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom (bisection on
    its distribution function; no SciPy in the stack)."""
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        low, high = high, high * 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if _t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2)."""
    return 1.0 - 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges on the other side
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result / a


@dataclass(frozen=True)
class StepTimeRule:
    """The night's step-time decision: ``tests`` tests share ``FAMILY_ALPHA``; ``night_rounds``
    against ``golden_rounds``, judged against ``noise``."""

    noise: Noise
    tests: int
    night_rounds: int
    golden_rounds: int

    def quantile(self, p: float, df: int) -> float:
        """A known noise: the normal quantile; one estimated from repeats: Student's t at its df."""
        if self.noise.known:
            return statistics.NormalDist().inv_cdf(p)
        return t_quantile(p, df)

    def critical(self, df: int) -> float:
        """The two-sided Bonferroni critical value of one of ``tests`` tests."""
        return self.quantile(1 - FAMILY_ALPHA / (2 * self.tests), df)

    @property
    def scale(self) -> float:
        """A difference of a night's mean and a golden's: sd * sqrt(1/N + 1/G)."""
        return math.sqrt(1 / self.night_rounds + 1 / self.golden_rounds)

    def tolerance(self, spread: Spread) -> float:
        """The largest |change| (log units) that passes a test of one round's ``spread``."""
        return self.critical(spread.df) * spread.sd * self.scale

    def detectable(self, spread: Spread) -> float:
        """The smallest change (log units) caught with ``DETECTION_POWER``."""
        power = self.quantile(DETECTION_POWER, spread.df)
        return (self.critical(spread.df) + power) * spread.sd * self.scale

    def describe(self, spread: Spread) -> str:
        """What a step-time line was judged against, for its tolerance column."""
        return (
            f"±{as_pct(self.tolerance(spread)):.1f} pp ({self.night_rounds} round(s) vs the golden's "
            f"{self.golden_rounds}; noise {as_pct(spread.sd):.1f} % per round from "
            f"{self.noise.source}{'' if self.noise.known else f', t at {spread.df} df'}; "
            f"{self.tests} tests share {FAMILY_ALPHA:.0%}; detectable >= "
            f"{as_pct(self.detectable(spread)):.0f} pp)"
        )


@dataclass(frozen=True)
class StepTimeDecision:
    """One row's step-time test: the control by its absolute time (``golden``/``night`` in ms, the
    geometric mean over rounds), any other row by its effect (percent against the control of its own
    round, the mean log-ratio over rounds)."""

    absolute: bool
    golden: float
    night: float
    change: float  # log units: night against golden
    spread: Spread  # of one round of what is tested (an effect: the row's and the control's)
    tolerance: float  # log units
    night_standard_error: float | None  # log units, an effect's over several rounds tonight

    @property
    def passed(self) -> bool:
        return abs(self.change) <= self.tolerance


def decide(
    golden_ms: dict[str, list[float]], night_ms: dict[str, list[float]], control: str, noise: Noise
) -> tuple[StepTimeRule, dict[str, StepTimeDecision]]:
    """Every row's step-time test of one night (rows: label -> steady time per round, the control's
    under ``control``), all sharing ``FAMILY_ALPHA``. A row is tested when both sides and the noise
    have it."""
    rows = [
        label
        for label in golden_ms
        if label != control and label in night_ms and label in noise.rows
    ]
    rule = StepTimeRule(noise, len(rows) + 1, len(night_ms[control]), len(golden_ms[control]))
    base = noise.rows[control]
    before_ms, now_ms = _geometric_mean(golden_ms[control]), _geometric_mean(night_ms[control])
    decisions = {
        control: StepTimeDecision(
            True,
            before_ms,
            now_ms,
            math.log(now_ms / before_ms),
            base,
            rule.tolerance(base),
            None,
        )
    }
    for label in rows:
        before = round_effect(golden_ms[label], golden_ms[control])
        now = round_effect(night_ms[label], night_ms[control])
        own = noise.rows[label]
        # Independent jobs: the log-ratio's variance is the row's and the control's.
        pair = Spread(math.sqrt(own.sd**2 + base.sd**2), welch_df((own, base)))
        decisions[label] = StepTimeDecision(
            False,
            before.pct,
            now.pct,
            now.mean - before.mean,
            pair,
            rule.tolerance(pair),
            now.standard_error,
        )
    return rule, decisions


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(value) for value in values))


def _within_job(times_ms: Sequence[float]) -> float:
    """One job's within-job noise as the relative standard error of its median: the steady
    iterations' robust spread (1.4826 MAD, relative to the median) times 1.2533 / sqrt(n)."""
    centre = statistics.median(times_ms)
    mad = statistics.median(abs(time - centre) for time in times_ms)
    return 1.4826 * mad / centre * 1.2533 / math.sqrt(len(times_ms))


def calibration(records: Sequence[Record]) -> dict[str, Any]:
    """What a noise-calibration sweep in rounds measured, per row: each job's warm-up (iterations),
    steady median and within-job noise; the row's job-to-job spread of log medians over rounds and
    the between-job part of it (the spread less the within-job part, in quadrature); and each row's
    per-round log-ratio against the control of its round (an A/A row's are pure noise)."""
    rounds = by_round(records)
    control = next((jobs for jobs in rounds.values() if jobs[0].recompute.is_control), None)
    rows: dict[str, Any] = {}
    for label, jobs in rounds.items():
        steady = [record_steady_time(job) for job in jobs]
        if any(found is None for found in steady):
            rows[label] = {"jobs": len(jobs), "steady": None}
            continue
        kept = [found for found in steady if found is not None]
        within = [
            _within_job(timed_iterations(job)[found.warmup :]) for job, found in zip(jobs, kept)
        ]
        logs = [math.log(found.median_ms) for found in kept]
        spread = statistics.stdev(logs) if len(logs) > 1 else None
        within_rms = math.sqrt(statistics.fmean(w * w for w in within))
        entry: dict[str, Any] = {
            "rounds": len(jobs),
            "warmup": [found.warmup for found in kept],
            "settled": [found.settled for found in kept],
            "median_ms": [found.median_ms for found in kept],
            "within_job_pct": [100 * w for w in within],
            "job_spread_pct": None if spread is None else 100 * spread,
            "between_job_pct": None
            if spread is None
            else 100 * math.sqrt(max(0.0, spread**2 - within_rms**2)),
        }
        if control is not None and label != control[0].label:
            base = [record_steady_time(job) for job in control]
            if all(found is not None for found in base) and len(base) == len(kept):
                effect = round_effect(
                    [found.median_ms for found in kept],
                    [found.median_ms for found in base if found is not None],
                )
                entry["log_ratio_vs_control"] = list(effect.log_ratios)
                entry["effect_pct"] = effect.pct
                entry["effect_se_pct"] = (
                    None if effect.standard_error is None else 100 * effect.standard_error
                )
        rows[label] = entry
    return {"rows": rows}
