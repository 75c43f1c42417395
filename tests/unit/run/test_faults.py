"""Fault injection through the real runner: each fault must come out with the right outcome and stage,
a record on disk, the failing rank's torchrun error file, and nothing left running."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.record.io import load_records
from harness.run import torchrun
from harness.run.faults import parse_fault
from harness.run.recipes import Parallelism, check_recipe, load_recipe
from harness.run.runner import run_sweep
from harness.run.torchrun import processes_with_token

# Two-rank torchrun sweeps, one per case: .ci/run's "sweeps" step, outside the tier's 150 s.
pytestmark = [pytest.mark.slow, pytest.mark.sweeps]


@pytest.mark.parametrize(
    "spec, status, iteration, phase, rank",
    [
        ("oom:iteration=2,phase=backward,rank=1", "oom", 2, "backward", 1),
        ("nan:iteration=2,rank=0", "nan", 2, "forward", 0),
        ("hang:iteration=1,phase=grad-sync,rank=1", "hang", 1, "grad-sync", 1),
    ],
)
def test_injected_fault_is_classified_with_its_stage(
    tmp_path, spec, status, iteration, phase, rank
):
    recipe = load_recipe("cpu-moonlight-ep2")
    # The stall window is how long the runner waits with no rank reporting progress (each phase of
    # each iteration is a report). The OOM and NaN rows end at their fault and never wait for it: a
    # short window there could only call a slow phase on a loaded machine a hang, so theirs is large.
    # The hang row waits it out once both ranks sit in the hung collective; 10 s is far more than one
    # phase of this tiny model takes under load, at 10 s of the tier's time.
    stall_timeout_s = 10 if status == "hang" else 300
    directory, (result,) = run_sweep(
        recipe, tmp_path, rows=[], faults=[parse_fault(spec)], stall_timeout_s=stall_timeout_s
    )
    outcome = result.outcome
    assert (outcome.status, outcome.iteration, outcome.phase) == (status, iteration, phase), (
        outcome.message
    )
    assert rank in outcome.ranks
    (record,) = load_records([directory / "records"])
    assert record.outcome.status == status and record.outcome.phase == phase
    assert (record.run_metrics.nan_iterations > 0) == (
        status == "nan"
    )  # the count matches the outcome
    assert processes_with_token(result.launch.token) == []
    if status == "hang":
        assert result.launch.stopped == "stall"
    else:  # the failing rank's exception also reached torchrun's error file (@record)
        error_files = list(result.row_dir.glob(f"torchrun/node0/*/attempt_0/{rank}/error.json"))
        assert len(error_files) == 1
        message = json.loads(error_files[0].read_text())["message"]["message"]
        assert ("out of memory" if status == "oom" else "non-finite loss") in message


def test_a_fault_that_never_fires_fails_its_row(tmp_path):
    # mcore's iteration 1 builds the optimizer (optimizer-init): an optimizer-step fault there never fires.
    # No peer is needed to show it: one rank (EP1) spares the tier a rank's start-up.
    recipe = dataclasses.replace(
        load_recipe("cpu-moonlight-ep2"), nproc_per_node=1, parallelism=Parallelism()
    )
    check_recipe(recipe)
    _, (result,) = run_sweep(
        recipe, tmp_path, rows=[], faults=[parse_fault("oom:iteration=1,phase=optimizer-step")]
    )
    assert result.outcome.status == "crash"
    assert "never fired" in result.outcome.message and result.record.outcome.status == "crash"


@pytest.mark.parametrize(
    "spec, phase, poll_s",
    [
        (
            "kill:iteration=2,phase=backward,rank=1",
            "backward",
            torchrun.POLL_S,
        ),  # SIGKILL: no error line, no error file
        # torchrun's agent notices the SIGKILL and stops rank 0 long before a 3 s poll: the runner
        # then sees both ranks gone unreported, and only torchrun's summary says which died first.
        ("kill:iteration=2,phase=backward,rank=1", "backward", 3.0),
        ("exit:iteration=2,phase=forward,rank=1", "forward", torchrun.POLL_S),  # exit 0, unreported
    ],
)
def test_the_rank_that_died_first_is_blamed_not_its_peer(
    tmp_path, monkeypatch, spec, phase, poll_s
):
    monkeypatch.setattr(torchrun, "POLL_S", poll_s)
    recipe = load_recipe("cpu-moonlight-ep2")
    directory, (result,) = run_sweep(
        recipe, tmp_path, rows=[], faults=[parse_fault(spec)], stall_timeout_s=6
    )
    outcome = result.outcome
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "crash",
        2,
        phase,
        (1,),
    ), outcome.message
    (record,) = load_records([directory / "records"])
    assert record.outcome.ranks == [1]
    assert processes_with_token(result.launch.token) == []
    assert (
        outcome.message.startswith("rank(s) [1] died at")
        and "collateral: rank(s) [0]" in outcome.message
    )
    assert result.launch.stopped in ("died", None)  # seen by the runner, or by torchrun first
