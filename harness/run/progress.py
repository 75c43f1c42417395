"""Live sweep progress with ``rich``: which row, its iteration and phase per rank, elapsed time, outcome."""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table

from harness.run.classify import Classification
from harness.run.events import RankEvidence

_STYLE = {"completed": "green", "oom": "red", "nan": "red", "crash": "red", "hang": "red",
          "advanced-but-failed": "yellow"}


def _rank_status(rank: RankEvidence) -> str:
    if rank.errors:
        return f"r{rank.rank} error@{rank.iteration}:{rank.phase}"
    if rank.done:
        return f"r{rank.rank} done"
    if not rank.started:
        return f"r{rank.rank} starting"
    return f"r{rank.rank} it{rank.iteration} {rank.phase}"


class LiveProgress:
    """One table line per row; the running row's line updates on every poll."""

    def __init__(self, recipe: str, rows: list[str], console: Console | None = None) -> None:
        self.recipe = recipe
        self.lines: dict[str, list[str]] = {row: [row, "pending", "", "", ""] for row in rows}
        self.live = Live(self._table(), console=console or Console(stderr=True), refresh_per_second=4,
                         transient=False)

    def _table(self) -> Table:
        table = Table(title=f"recompute-harness run {self.recipe}")
        for column in ("row", "status", "iteration", "elapsed", "ranks"):
            table.add_column(column)
        for row, (name, status, iteration, elapsed, ranks) in self.lines.items():
            style = next((s for key, s in _STYLE.items() if status.startswith(key)), None)
            table.add_row(name, f"[{style}]{status}[/]" if style else status, iteration, elapsed, ranks)
        return table

    def __enter__(self) -> "LiveProgress":
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    def row_started(self, row: str) -> None:
        self.lines[row][1] = "running"
        self.live.update(self._table())

    def poll(self, row: str, ranks: list[RankEvidence], elapsed_s: float) -> None:
        line = self.lines[row]
        line[2] = str(min((rank.iteration for rank in ranks), default=0))
        line[3] = f"{elapsed_s:.0f} s"
        line[4] = ", ".join(_rank_status(rank) for rank in ranks)
        self.live.update(self._table())

    def row_finished(self, row: str, outcome: Classification, elapsed_s: float) -> None:
        line = self.lines[row]
        where = f" @ it{outcome.iteration} {outcome.phase}" if outcome.status != "completed" and outcome.phase else ""
        line[1] = f"{outcome.status}{where}"
        line[3] = f"{elapsed_s:.0f} s"
        if outcome.ranks:
            line[4] = f"rank(s) {', '.join(map(str, outcome.ranks))}"
        self.live.update(self._table())
