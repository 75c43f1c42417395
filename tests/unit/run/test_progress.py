"""Sweep progress: row k/N, iteration i/N, ETA, ranks grouped by state; plain timestamped lines in a log; a
progress reader that went away silences the progress, never the sweep."""

from __future__ import annotations

import io
import os
import re

from rich.console import Console

from harness.run.classify import Classification
from harness.run.events import RankEvidence
from harness.run.progress import LiveProgress, ProgressConsole, eta_s, rank_states


def _ranks(count: int, iteration: int, phase: str = "forward") -> list[RankEvidence]:
    return [
        RankEvidence(rank=r, started=True, iteration=iteration, phase=phase) for r in range(count)
    ]


def test_sixteen_ranks_in_one_state_are_one_line_and_stragglers_their_own():
    ranks = _ranks(16, 3)
    assert rank_states(ranks) == ["it3 forward: r0-15"]
    ranks[5] = RankEvidence(rank=5, started=True, iteration=2, phase="backward")
    ranks[9] = RankEvidence(rank=9, started=True, iteration=2, phase="backward")
    assert rank_states(ranks) == ["it3 forward: r0-4,6-8,10-15", "it2 backward: r5,9"]
    assert eta_s(2, 6, 10.0) == 20.0 and eta_s(0, 6, 10.0) is None


def test_a_log_gets_one_timestamped_line_per_change_not_per_poll():
    out = io.StringIO()
    progress = LiveProgress(
        "cpu-moonlight-ep2",
        ["[]", "mla_up_proj"],
        4,
        console=Console(file=out, width=80),
        plain=True,
    )
    with progress:
        progress.row_started("[]")
        for _ in range(3):  # polls without progress add nothing
            progress.poll("[]", _ranks(16, 2), 8.0)
        progress.poll("[]", _ranks(16, 3), 12.0)
        progress.row_finished("[]", Classification("completed", None, None, (), ""), 16.0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert all(
        re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ cpu-moonlight-ep2 row 1/2 \[\]: ", line)
        for line in lines
    )
    assert "iteration 2/4, elapsed 8 s, ETA 8 s, ranks it2 forward: r0-15" in lines[1]
    assert "iteration 3/4, elapsed 12 s, ETA 4 s" in lines[2] and lines[3].split(": ", 1)[
        1
    ].startswith("completed")


def test_a_terminal_gets_the_table_with_row_and_iteration_counts():
    out = io.StringIO()
    progress = LiveProgress(
        "r",
        ["[]", "moe_act"],
        6,
        console=Console(file=out, width=120, force_terminal=True),
        plain=False,
    )
    with progress:
        progress.row_started("[]")
        progress.poll("[]", _ranks(16, 2), 10.0)
    text = out.getvalue()
    assert (
        "1/2 []" in text
        and "2/2 moe_act" in text
        and "2/6" in text
        and "it2 forward: r0-15" in text
    )


def test_a_closed_progress_pipe_silences_the_progress_and_the_sweep_goes_on():
    # `run ... 2>&1 | head -1`: a real pipe whose reader has gone. rich's default raises SystemExit(1), which
    # the runner takes for a stop signal: the row's processes stopped and recorded as interrupted.
    reader, writer = os.pipe()
    os.close(reader)
    with open(writer, "w", encoding="utf-8") as stream:
        progress = LiveProgress(
            "r", ["[]", "moe_act"], 4, console=ProgressConsole(file=stream, width=80), plain=True
        )
        with progress:
            progress.row_started("[]")
            for iteration in (1, 2, 3):
                progress.poll("[]", _ranks(2, iteration), 4.0 * iteration)
            progress.row_finished("[]", Classification("completed", None, None, (), ""), 16.0)
        assert progress.console.quiet
        assert os.path.samefile(
            f"/proc/self/fd/{stream.fileno()}", os.devnull
        )  # later writes are quiet too
