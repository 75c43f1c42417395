"""Sweeps in rounds (issue 42): the rotation, the slow fault, and the CPU rehearsal of the nightly's
step-time rule: an A/A night on this noisy CPU passes, a row made slower is named."""

from __future__ import annotations

import dataclasses

import pytest

from harness.errors import UsageError
from harness.golden.format import golden_from_records
from harness.golden.judge import compare_records
from harness.record.io import load_records
from harness.record.metrics import MetricName
from harness.record.step_time import record_steady_time, round_index
from harness.run.faults import parse_fault
from harness.run.recipes import Parallelism, check_recipe, load_recipe
from harness.run.runner import round_order, run_sweep, sweep_jobs


def test_rounds_rotate_so_every_row_runs_first_once():
    rows = ["[]", "a", "b"]
    orders = [round_order(rows, number) for number in (1, 2, 3)]
    assert orders == [["[]", "a", "b"], ["a", "b", "[]"], ["b", "[]", "a"]]
    # A Latin square: every row in every position once over as many rounds as rows.
    assert all(sorted(order[i] for order in orders) == sorted(rows) for i in range(3))
    assert round_order(rows, 4) == orders[0]
    assert sweep_jobs(rows, None) == [("[]", None), ("a", None), ("b", None)]
    assert [number for _, number in sweep_jobs(rows, 2)] == [1, 1, 1, 2, 2, 2]


def test_the_slow_fault_delays_every_step_from_its_iteration():
    fault = parse_fault("slow:iteration=3,phase=forward,ms=40,row=moe_act")
    assert fault.delay_ms == 40 and fault.applies_to("moe_act") and not fault.applies_to("[]")
    assert not fault.fires(2, "forward", 0)
    assert fault.fires(3, "forward", 0) and fault.fires(9, "forward", 0)
    assert parse_fault(fault.spec()) == fault
    for bad, why in (
        ("slow:iteration=1", "belongs to, and only to, slow"),
        ("oom:ms=5", "belongs to, and only to, slow"),
        ("slow:ms=-1", "above 0"),
        ("slow:ms=x", "milliseconds"),
    ):
        with pytest.raises(UsageError, match=why):
            parse_fault(bad)


def _timed_recipe():
    """cpu-moonlight-ep2 on one rank with 40 iterations (~30 ms each when the machine is quiet). This
    shared CPU is not quiet: other users' bursts slow a few seconds of iterations 10-40 fold (measured:
    28 ms steps around runs of 300-1,300 ms ones), and a median of 9 iterations is taken over by them;
    40 keep the bursts a minority of each job's steady iterations."""
    recipe = dataclasses.replace(
        load_recipe("cpu-moonlight-ep2"),
        nproc_per_node=1,
        parallelism=Parallelism(),
        train_iters=40,
        steady_window=(3, 40),
        rows=["[]", "moe_act"],
    )
    check_recipe(recipe)
    return recipe


@pytest.mark.slow
@pytest.mark.sweeps
def test_on_cpu_an_aa_night_passes_and_a_slowed_row_is_named(tmp_path):
    recipe = _timed_recipe()
    # Golden and night interleaved in one sweep of 4 rounds (odd rounds the golden's, even the
    # night's), so the load the other users of this machine put on it falls on both alike.
    directory, results = run_sweep(recipe, tmp_path / "aa", rounds=4)
    assert [(r.row, round_index(r.record)) for r in results] == [
        ("[]", 1), ("moe_act", 1), ("moe_act", 2), ("[]", 2),
        ("[]", 3), ("moe_act", 3), ("moe_act", 4), ("[]", 4),
    ]  # fmt: skip
    records = load_records([directory / "records"])
    assert all(record_steady_time(record) is not None for record in records)
    golden = golden_from_records(
        [r for r in records if round_index(r) % 2], {"source": "CPU rehearsal"}
    )
    night = [r for r in records if not round_index(r) % 2]
    aa = compare_records(golden, night, "cpu golden")
    assert aa.passed, aa.failures
    lines = [c for c in aa.checks if c.metric == MetricName.STEP_TIME_COST_PCT]
    assert len(lines) == 1 and "each row's repeats (golden 2, tonight 2)" in lines[0].tolerance
    # The same rows with moe_act's every step from iteration 2 slowed by twenty quiet control steps:
    # with two rounds a side the rule's detectable change on this shared CPU has been measured from
    # +50 % to several hundred per cent (per-round noise 16-72 % under load); +300 % (three steps)
    # went unnamed in one CI run, so the injected change stands far beyond that.
    control_ms = next(row for row in golden.rows if row.label == "[]").step_time
    assert control_ms is not None
    delay = 20 * min(control_ms["median_ms"])
    fault = parse_fault(f"slow:iteration=2,phase=forward,ms={delay:.0f},row=moe_act")
    slowed_dir, _ = run_sweep(recipe, tmp_path / "slow", rounds=2, faults=[fault])
    slowed = compare_records(golden, load_records([slowed_dir / "records"]), "cpu golden")
    named = {(f.label, f.metric, f.verdict) for f in slowed.failures}
    assert ("moe_act", MetricName.STEP_TIME_COST_PCT, "FAIL: cost grew beyond tolerance") in named
