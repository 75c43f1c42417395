"""Step time in rounds (harness.record.step_time): warm-up found from the series, per-round medians,
log-ratio effects with their standard error, noise from repeats or A/A rows, the decision rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from resampled_nights import landed_records

from harness.record.step_time import (
    FAMILY_ALPHA,
    Noise,
    RoundEffect,
    Spread,
    StepTimeRule,
    as_pct,
    decide,
    noise_from_equal_rows,
    noise_from_repeats,
    record_steady_time,
    round_effect,
    steady_time,
    t_quantile,
    welch_df,
)

ROOT = Path(__file__).resolve().parents[3]


def test_the_landed_control_was_still_warming_up_inside_its_window():
    # The runner's window was iterations 11-20; the [] row took 276 and 292 ms at 11 and 12, then fell.
    found = {r.label: record_steady_time(r) for r in landed_records()}
    control = found["[]"]
    assert control is not None and control.settled
    assert control.warmup == 11 and control.steady == 9
    assert control.median_ms == pytest.approx(211.384, abs=1e-3)
    # The other rows settle earlier, each where its own series stops falling.
    assert {label: s.warmup for label, s in found.items() if s is not None} == {
        "[]": 11,
        "core_attn": 7,
        "mla_up_proj": 7,
        "moe": 5,
        "moe_act": 5,
    }


def test_a_flat_series_has_only_its_first_iteration_as_warmup():
    found = steady_time([900.0] + [100.0, 101.0, 99.0, 100.5, 100.0, 99.5, 100.2, 100.1])
    assert (found.warmup, found.settled, found.median_ms) == (1, True, 100.05)


def test_a_series_still_falling_at_its_end_is_said_to_be_unsettled():
    found = steady_time([200.0 - 10 * i for i in range(12)])
    assert not found.settled and found.steady == 5 and found.warmup == 7


def test_too_short_a_series_is_refused():
    with pytest.raises(ValueError, match="at least 6"):
        steady_time([1.0, 2.0, 3.0])


def test_an_effect_is_the_mean_log_ratio_with_its_standard_error():
    effect = round_effect([110.0, 121.0, 99.0], [100.0, 110.0, 100.0])
    logs = [math.log(1.1), math.log(1.1), math.log(0.99)]
    assert effect.mean == pytest.approx(sum(logs) / 3)
    assert effect.standard_error == pytest.approx(
        math.sqrt(sum((x - effect.mean) ** 2 for x in logs) / 2) / math.sqrt(3)
    )
    assert round_effect([110.0], [100.0]).standard_error is None
    assert as_pct(math.log(1.1)) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        round_effect([1.0, 2.0], [1.0])


def test_noise_from_repeats_keeps_each_rows_own_spread_pooled_over_golden_and_night():
    assert noise_from_repeats([{"[]": [100.0]}], "x") is None  # one round: nothing to pool
    golden = {"[]": [100.0, 104.0], "moe": [110.0, 110.0]}
    night = {"[]": [98.0, 101.0, 103.0], "moe": [111.0]}
    noise = noise_from_repeats([golden, night], "repeats")
    assert noise is not None and not noise.known
    control = noise.rows["[]"]
    logs_g = [math.log(100.0), math.log(104.0)]
    logs_n = [math.log(98.0), math.log(101.0), math.log(103.0)]
    squares = sum((x - sum(logs_g) / 2) ** 2 for x in logs_g) + sum(
        (x - sum(logs_n) / 3) ** 2 for x in logs_n
    )
    assert control.df == 3 and control.sd == pytest.approx(math.sqrt(squares / 3))
    assert noise.rows["moe"] == Spread(0.0, 1)  # its night has one round: the golden's alone


def test_noise_from_equal_rows_is_their_root_mean_square_taken_as_known():
    noise = noise_from_equal_rows({"moe_act": round_effect([105.0], [100.0])}, ["[]", "moe"])
    assert noise is not None and noise.known and noise.source == "A/A rows [] = moe_act"
    assert set(noise.rows) == {"[]", "moe"}
    assert noise.rows["moe"].sd == pytest.approx(math.log(1.05) / math.sqrt(2))
    assert noise_from_equal_rows({}, ["[]"]) is None


def test_welch_degrees_of_freedom():
    assert welch_df([Spread(0.05, 4), Spread(0.05, 4)]) == 8
    assert welch_df([Spread(0.10, 2), Spread(0.01, 30)]) == 2  # the noisy part's


def test_student_t_quantiles_match_the_tables():
    for p, df, table in (
        (0.975, 1, 12.706),
        (0.999, 3, 10.215),
        (0.995, 10, 3.169),
        (0.9, 30, 1.310),
    ):
        assert t_quantile(p, df) == pytest.approx(table, abs=1e-3)


def test_the_rule_shares_its_false_alarm_budget_and_narrows_with_rounds():
    known = Noise({"[]": Spread(0.05, 1), "moe": Spread(0.05, 1)}, "A/A", known=True)
    one = StepTimeRule(known, tests=5, night_rounds=1, golden_rounds=1)
    # Bonferroni: 1 % over 5 two-sided tests -> z = 3.09
    assert FAMILY_ALPHA == 0.01 and one.critical(1) == pytest.approx(3.0902, abs=1e-4)
    assert one.tolerance(Spread(0.05, 1)) == pytest.approx(3.0902 * 0.05 * math.sqrt(2), abs=1e-4)
    # 90 % power: z + 1.2816
    assert one.detectable(Spread(0.05, 1)) == pytest.approx(
        (3.0902 + 1.2816) * 0.05 * math.sqrt(2), abs=1e-4
    )
    four = StepTimeRule(known, tests=5, night_rounds=4, golden_rounds=4)
    assert four.tolerance(Spread(0.05, 1)) == pytest.approx(one.tolerance(Spread(0.05, 1)) / 2)
    text = four.describe(Spread(0.05, 1))
    assert (
        "4 round(s) vs the golden's 4" in text and "detectable >= " in text and "from A/A" in text
    )
    # Estimated from repeats: Student's t at the spread's degrees of freedom, wider than z.
    repeats = StepTimeRule(
        Noise({"[]": Spread(0.04, 2)}, "repeats", known=False), 5, night_rounds=4, golden_rounds=4
    )
    assert repeats.tolerance(Spread(0.05, 8)) == pytest.approx(
        t_quantile(1 - 0.001, 8) * 0.05 * math.sqrt(0.5)
    )
    assert "t at 8 df" in repeats.describe(Spread(0.05, 8))


def test_a_night_is_decided_row_by_row_against_the_control_of_its_own_round():
    noise = Noise({"[]": Spread(0.02, 10), "moe": Spread(0.02, 10)}, "repeats", known=False)
    golden = {"[]": [200.0, 210.0], "moe": [220.0, 231.0]}  # +10 % each round
    rule, same = decide(golden, {"[]": [190.0, 200.0], "moe": [209.0, 220.0]}, "[]", noise)
    assert rule.tests == 2 and all(d.passed for d in same.values())
    assert same["moe"].golden == pytest.approx(10.0) and same["moe"].spread.df == 20
    assert same["[]"].change == pytest.approx(math.log(math.sqrt(190 * 200) / math.sqrt(200 * 210)))
    _, slower = decide(golden, {"[]": [200.0, 210.0], "moe": [264.0, 277.2]}, "[]", noise)
    assert not slower["moe"].passed and slower["moe"].night == pytest.approx(32.0)
    assert slower["[]"].passed


def test_the_landed_instrumentation_overhead_is_inconclusive_in_rounds():
    # benchmarks/instrumentation_overhead.py on the H200: 6 rounds, pairs from -15 % to +32 %.
    landed = json.loads(
        (ROOT / "tests/measured/gpu-check-h200-20261204/instrumentation-overhead.json").read_text()
    )
    effect = RoundEffect(tuple(math.log1p(p / 100) for p in landed["overhead_pct_pairs"]))
    low, high = effect.interval_pct()
    assert effect.pct == pytest.approx(5.75, abs=0.01)
    assert (low, high) == (pytest.approx(-12.34, abs=0.01), pytest.approx(27.57, abs=0.01))
    assert low < 1.0 < high  # neither meets nor refutes the <= 1 % target
    assert RoundEffect((0.1,)).interval_pct() is None
