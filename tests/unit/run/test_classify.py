"""Blame from evidence, on evidence files written by the workers' own EventWriter: an agent lost on
any node fails the row; a rank that died silently is blamed, not the peer that lost it."""

from __future__ import annotations

from harness.run.classify import classify
from harness.run.events import EventWriter, read_row
from harness.run.torchrun import LaunchResult


def _evidence(
    row_dir, world: int, *, finished: set[int], peer_loss: frozenset[int] | set[int] = frozenset()
):
    for rank in range(world):
        events = EventWriter(row_dir, rank)
        events.emit("start", rank=rank, world_size=world, pid=1, host="h", device="cpu")
        for iteration in (1, 2):
            events.emit("phase", iteration=iteration, phase="forward")
            if rank not in finished and iteration == 2:
                if rank in peer_loss:
                    events.emit(
                        "error",
                        iteration=2,
                        phase="forward",
                        type="RuntimeError",
                        message="Connection reset by peer",
                        local_loss_finite=True,
                    )
                break
            events.emit("iteration", iteration=iteration, loss=1.0, step_time_ms=1.0, nan=False)
        if rank in finished:
            events.emit("done")
        events.close()
    return read_row(row_dir, world)


def _classify(row_dir, ranks, returncodes):
    return classify(
        ranks,
        LaunchResult(returncodes, 1.0, "t"),
        train_iters=2,
        row_dir=row_dir,
        stall_timeout_s=5,
        timeout_s=60,
    )


def test_an_agent_killed_on_the_second_node_fails_the_row(tmp_path):
    ranks = _evidence(tmp_path, 4, finished={0, 1, 2, 3})
    assert _classify(tmp_path, ranks, [0, 0]).status == "completed"
    outcome = _classify(tmp_path, ranks, [0, -9])
    assert (outcome.status, outcome.ranks) == ("crash", (2, 3)) and "SIGKILL" in outcome.message


def test_the_silent_rank_is_blamed_and_the_peer_is_collateral(tmp_path):
    ranks = _evidence(tmp_path, 2, finished=set(), peer_loss={0})
    outcome = _classify(tmp_path, ranks, [1])
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "crash",
        2,
        "forward",
        (1,),
    )
    assert "collateral: rank(s) [0]" in outcome.message


def test_ranks_that_died_before_reporting_are_told_by_their_last_words(tmp_path):
    # Both ranks died while importing (no event, no torchrun error file): the exception line of a rank's
    # stderr is the evidence, not the warnings printed before it.
    for rank in (0, 1):
        log = tmp_path / "torchrun" / "node0" / "job_x" / "attempt_0" / str(rank) / "stderr.log"
        log.parent.mkdir(parents=True)
        log.write_text(
            "UserWarning: Transformer Engine and Apex are not installed.\nTraceback (most recent call last):\n"
            "  File \"worker.py\", line 1\nModuleNotFoundError: No module named 'megatron.core'\n"
            "  warnings.warn(\n"
        )
    outcome = _classify(tmp_path, read_row(tmp_path, 2), [1])
    assert (outcome.status, outcome.iteration, outcome.ranks) == ("crash", None, (0, 1))
    assert outcome.message.endswith(
        "last words: torchrun/node0/job_x/attempt_0/0/stderr.log: "
        "ModuleNotFoundError: No module named 'megatron.core'"
    ), outcome.message


def test_an_agent_that_failed_before_starting_workers_is_told_by_its_log(tmp_path):
    (tmp_path / "launcher0.log").write_text(
        "torch.distributed.DistStoreError: failed to bind the store port\n\n"
    )
    outcome = _classify(tmp_path, read_row(tmp_path, 2), [1])
    assert (
        "last words: launcher0.log: torch.distributed.DistStoreError: failed to bind the store port"
        in outcome.message
    )
