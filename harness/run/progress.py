"""Sweep progress: row k/N, iteration i/N, elapsed and ETA per row, and the ranks grouped by state.

On a terminal a ``rich`` table updates in place. In a log (stdout or the progress stream is not a
terminal: CI, ``| tee``, sbatch output) a live table prints nothing useful until the end, so each change
is one plain timestamped line instead: a row starting, its slowest rank reaching a new iteration, the
row finishing. Ranks in the same state share one line (``it3 forward: r0-15``), so 16 ranks fit.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.live import Live
from rich.table import Table

from harness.run.classify import Classification
from harness.run.events import RankEvidence

_STYLE = {
    "completed": "green",
    "oom": "red",
    "nan": "red",
    "crash": "red",
    "hang": "red",
    "advanced-but-failed": "yellow",
}


class ProgressConsole(Console):
    """The progress stream's console. Its reader going away (``run ... 2>&1 | head``, a dead ``tee``) only
    silences the progress: rich's own answer, ``SystemExit(1)``, would stop the sweep mid-row and record
    the row as interrupted. The stream's descriptor then points at /dev/null, so later lines (the CLI's
    own error line, Python's flush at exit) are quiet too."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.file.fileno())
        os.close(devnull)


def _rank_state(rank: RankEvidence) -> str:
    if rank.errors:
        return f"error@{rank.iteration}:{rank.phase}"
    if rank.done:
        return "done"
    if not rank.started:
        return "starting"
    return f"it{rank.iteration} {rank.phase}"


def _spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``r0-2,5,7-8``."""
    spans: list[str] = []
    ranks = sorted(ranks)
    start = previous = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return "r" + ",".join(spans)


def rank_states(ranks: list[RankEvidence]) -> list[str]:
    """One line per state, in rank order of first appearance: ``it3 forward: r0-15``."""
    grouped: dict[str, list[int]] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        grouped.setdefault(_rank_state(rank), []).append(rank.rank)
    return [f"{state}: {_spans(members)}" for state, members in grouped.items()]


def eta_s(iteration: int, iterations: int, elapsed_s: float) -> float | None:
    """Remaining seconds at the row's mean pace so far; None before the first iteration ends."""
    if iteration <= 0 or iterations <= 0:
        return None
    return elapsed_s / iteration * max(iterations - iteration, 0)


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} s"


class LiveProgress:
    """One line per row; the running row's line updates on every poll (or logs when it changes)."""

    def __init__(
        self,
        recipe: str,
        rows: list[str],
        iterations: int,
        console: Console | None = None,
        plain: bool | None = None,
    ) -> None:
        self.recipe = recipe
        self.iterations = iterations
        self.console = console or ProgressConsole(stderr=True)
        self.plain = (
            (not (sys.stdout.isatty() and self.console.is_terminal)) if plain is None else plain
        )
        self.order = {row: k for k, row in enumerate(rows, start=1)}
        self.lines: dict[str, list[str]] = {
            row: [f"{k}/{len(rows)} {row}", "pending", "", "", "", ""]
            for row, k in self.order.items()
        }
        self._logged: dict[str, int] = {}
        self.live = (
            None
            if self.plain
            else Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
        )

    def _table(self) -> Table:
        table = Table(title=f"recompute-harness run {self.recipe}")
        for column in ("row", "status", "iteration", "elapsed", "ETA", "ranks"):
            table.add_column(column)
        for name, status, iteration, elapsed, eta, ranks in self.lines.values():
            style = next((s for key, s in _STYLE.items() if status.startswith(key)), None)
            table.add_row(
                name, f"[{style}]{status}[/]" if style else status, iteration, elapsed, eta, ranks
            )
        return table

    def _show(self, row: str, force: bool = False) -> None:
        if self.live is not None:
            self.live.update(self._table())
            return
        name, status, iteration, elapsed, eta, ranks = self.lines[row]
        if not force and self._logged.get(row) == hash((status, iteration)):
            return  # plain log: only changes, not every poll
        self._logged[row] = hash((status, iteration))
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        parts = [f"{stamp} {self.recipe} row {name}: {status}"]
        if iteration:
            parts.append(f"iteration {iteration}")
        if elapsed:
            parts.append(f"elapsed {elapsed}, ETA {eta}" if eta else f"elapsed {elapsed}")
        if ranks:
            parts.append("ranks " + "; ".join(ranks.splitlines()))
        self.console.print(", ".join(parts), markup=False, highlight=False, soft_wrap=True)

    def __enter__(self) -> Self:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.live is not None:
            self.live.__exit__(exc_type, exc, traceback)

    def row_started(self, row: str) -> None:
        self.lines[row][1] = "running"
        self._show(row, force=True)

    def poll(self, row: str, ranks: list[RankEvidence], elapsed_s: float) -> None:
        line = self.lines[row]
        iteration = min((rank.iteration for rank in ranks), default=0)
        line[2] = f"{iteration}/{self.iterations}"
        line[3] = _seconds(elapsed_s)
        line[4] = _seconds(eta_s(iteration, self.iterations, elapsed_s))
        line[5] = "\n".join(rank_states(ranks))
        self._show(row)

    def row_finished(self, row: str, outcome: Classification, elapsed_s: float) -> None:
        line = self.lines[row]
        where = (
            f" @ it{outcome.iteration} {outcome.phase}"
            if outcome.status != "completed" and outcome.phase
            else ""
        )
        line[1] = f"{outcome.status}{where}"
        line[3] = _seconds(elapsed_s)
        line[4] = ""
        if outcome.ranks:
            line[5] = f"rank(s) {', '.join(map(str, outcome.ranks))}"
        self._show(row, force=True)
