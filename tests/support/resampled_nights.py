"""Nights made the way noise makes them, from the landed H200 records (tests/measured/gpu-check-h200-20261204):
each job's steady iterations resampled with replacement (a smoothed bootstrap), and the whole job
scaled by a between-job factor. ``tests/unit/golden/test_resampled_nights.py`` and ``benchmarks/nightly_error_rates.py`` judge
them with the real comparator; nothing here decides a verdict.

A night in today's single-job format keeps each record's warm-up iterations and steady window where
they were (``steady_window``) and its headline the window's mean, as the runner writes it. A night in
rounds marks each job with its round (``workload.extra["round"]``); a row made slower is slower in
every iteration.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.record.io import load_records
from harness.record.metrics import MetricName
from harness.record.model import Record
from harness.record.step_time import ROUND_KEY, steady_time

ROOT = Path(__file__).resolve().parents[2]
LANDED = ROOT / "tests" / "measured" / "gpu-check-h200-20261204"
LANDED_GOLDEN = next((ROOT / "tests" / "golden").glob("mcore-moonlight-1gpu__H200x1__*.json"))


def landed_records() -> list[Record]:
    return load_records([LANDED / "records"])


def landed_json() -> list[dict[str, Any]]:
    """The landed records as JSON, parsed once by the caller and copied per job."""
    return [record.to_json() for record in landed_records()]


def resampled_times(
    times: list[float], first: int, rng: random.Random, factor: float, length: int | None = None
) -> list[float]:
    """``times`` (one job's iterations, 1-based ``first`` the first steady one) rerun: the warm-up
    before ``first`` kept, the steady iterations drawn with replacement from the job's own (``length``
    iterations in all: a longer job than the landed one), every one scaled by ``factor``.

    A smoothed bootstrap with its variance kept (Silverman 1986, 6.4.1): each draw's log is jittered by
    a normal kernel of Silverman's width w = 1.06 s n^-1/5 and shrunk towards the steady mean by
    sqrt(1 + w^2 / s^2), so a rerun keeps the job's own mean and spread while its median is not one
    of the landed values (a plain resample of 9 values ties two reruns' medians exactly, a spread of
    zero no GPU shows)."""
    steady = times[first - 1 :]
    logs = [math.log(time) for time in steady]
    centre, spread = statistics.fmean(logs), statistics.stdev(logs)
    width = 1.06 * spread * len(logs) ** -0.2
    shrink = math.sqrt(1 + (width / spread) ** 2)
    drawn = [
        math.exp(centre + (rng.choice(logs) - centre + rng.gauss(0.0, width)) / shrink)
        for _ in range((length or len(times)) - first + 1)
    ]
    return [time * factor for time in times[: first - 1] + drawn]


def resampled_job(
    landed: dict[str, Any],
    rng: random.Random,
    between_job: float,
    *,
    slower: float = 1.0,
    round_number: int | None = None,
) -> Record:
    """One rerun of ``landed``'s job, every iteration scaled by ``exp(N(0, between_job))`` and by
    ``slower``. Its steady iterations are resampled with replacement: in today's format the record's
    steady window (what its headline averages), in rounds those after the warm-up ``steady_time``
    finds (what a round's median is taken over); the warm-up before them is kept as it was."""
    data = copy.deepcopy(landed)
    metrics = data["metrics"]
    window = metrics["steady_window"]
    iterations = metrics["iterations"]
    times = [row["step_time_ms"] for row in iterations]
    first = window["first"] if round_number is None else steady_time(times).warmup + 1
    factor = math.exp(rng.gauss(0.0, between_job)) * slower
    for row, time in zip(iterations, resampled_times(times, first, rng, factor)):
        row["step_time_ms"] = time
    metrics["headline"][MetricName.STEP_TIME_MS] = statistics.fmean(
        row["step_time_ms"]
        for row in iterations
        if window["first"] <= row["iteration"] <= window["last"]
    )
    suffix = rng.getrandbits(48)
    data["id"] = f"{data['id'].rsplit('/', 1)[0]}/{suffix:012x}"
    if round_number is not None:
        data["workload"].setdefault("extra", {})[ROUND_KEY] = str(round_number)
    return Record.from_json(data, "resampled")


def resampled_night(
    landed: list[dict[str, Any]],
    rng: random.Random,
    between_job: float,
    *,
    slower: Mapping[str, float] | None = None,
    rounds: int | None = None,
) -> list[Record]:
    """Every landed row rerun once (``rounds`` None: today's format) or ``rounds`` times, each round
    in rotated order (the order does not change a resampled job; it is kept so the records say it)."""
    slower = slower or {}
    labels = [data["id"].split("/")[1] for data in landed]
    if rounds is None:
        return [
            resampled_job(data, rng, between_job, slower=slower.get(label, 1.0))
            for data, label in zip(landed, labels)
        ]
    night = []
    for number in range(1, rounds + 1):
        shift = (number - 1) % len(landed)
        for data, label in zip(landed[shift:] + landed[:shift], labels[shift:] + labels[:shift]):
            night.append(
                resampled_job(
                    data, rng, between_job, slower=slower.get(label, 1.0), round_number=number
                )
            )
    return night
