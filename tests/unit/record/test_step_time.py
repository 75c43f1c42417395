"""Step time in rounds (harness.record.step_time): warm-up found from the series, per-round medians,
log-ratio effects with their standard error, noise from repeats or A/A rows, the decision rule."""

from __future__ import annotations

import math

import pytest
from resampled_nights import landed_records

from harness.record.step_time import (
    FAMILY_ALPHA,
    Noise,
    StepTimeRule,
    as_pct,
    noise_from_equal_rows,
    noise_from_repeats,
    record_steady_time,
    round_effect,
    steady_time,
    t_quantile,
)


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


def test_noise_from_repeats_pools_rows_and_keeps_the_controls_own():
    assert noise_from_repeats([round_effect([100.0], [100.0])], [100.0], "x") is None  # one round
    spread = round_effect([110.0, 90.0], [100.0, 104.0])
    noise = noise_from_repeats([spread], [100.0, 104.0], "the golden's 2 rounds")
    assert noise is not None and not noise.known
    d = math.log(1.1), math.log(90 / 104)
    centre = sum(d) / 2
    assert (noise.pair_df, noise.job_df) == (1, 1)
    assert noise.pair_sd == pytest.approx(math.sqrt(sum((x - centre) ** 2 for x in d)))
    assert noise.job_sd == pytest.approx(abs(math.log(104 / 100)) / math.sqrt(2))


def test_noise_from_equal_rows_is_their_root_mean_square_taken_as_known():
    noise = noise_from_equal_rows({"moe_act": round_effect([105.0], [100.0])})
    assert noise is not None and noise.known and noise.pair_df == 1
    assert noise.source == "A/A rows [] = moe_act"
    assert noise.pair_sd == pytest.approx(math.log(1.05))
    assert noise.job_sd == pytest.approx(math.log(1.05) / math.sqrt(2))
    assert noise_from_equal_rows({}) is None


def test_student_t_quantiles_match_the_tables():
    for p, df, table in (
        (0.975, 1, 12.706),
        (0.999, 3, 10.215),
        (0.995, 10, 3.169),
        (0.9, 30, 1.310),
    ):
        assert t_quantile(p, df) == pytest.approx(table, abs=1e-3)


def test_the_rule_shares_its_false_alarm_budget_and_narrows_with_rounds():
    known = Noise(0.05, 1, 0.05 / math.sqrt(2), 1, "A/A", known=True)
    one = StepTimeRule(known, tests=5, night_rounds=1, golden_rounds=1)
    # Bonferroni: 1 % over 5 two-sided tests -> z = 3.09
    assert FAMILY_ALPHA == 0.01 and one.critical(1) == pytest.approx(3.0902, abs=1e-4)
    assert one.effect_tolerance() == pytest.approx(3.0902 * 0.05 * math.sqrt(2), abs=1e-4)
    assert one.absolute_tolerance() == pytest.approx(one.effect_tolerance() / math.sqrt(2))
    # 90 % power: z + 1.2816
    assert one.detectable_effect() == pytest.approx(
        (3.0902 + 1.2816) * 0.05 * math.sqrt(2), abs=1e-4
    )
    four = StepTimeRule(known, tests=5, night_rounds=4, golden_rounds=4)
    assert four.effect_tolerance() == pytest.approx(one.effect_tolerance() / 2)
    text = four.describe(four.effect_tolerance(), four.detectable_effect())
    assert (
        "4 round(s) vs the golden's 4" in text and "detectable >= " in text and "from A/A" in text
    )
    # Estimated from 8 degrees of freedom of repeats: Student's t, wider than z.
    repeats = StepTimeRule(
        Noise(0.05, 8, 0.04, 2, "repeats", known=False), tests=5, night_rounds=4, golden_rounds=4
    )
    assert repeats.effect_tolerance() == pytest.approx(
        t_quantile(1 - 0.001, 8) * 0.05 * math.sqrt(0.5)
    )
    assert repeats.absolute_tolerance() == pytest.approx(
        t_quantile(1 - 0.001, 2) * 0.04 * math.sqrt(0.5)
    )
    assert "t at 8 df" in repeats.describe(1.0, 1.0)
