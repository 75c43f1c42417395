"""The verdict block a command ends with, pytest-style: what was judged, what was found, the first
failure named, each reason said once, the wall time, and a last line that says PASS or FAIL in words.

The block is the last screen of ``probe``, ``diff`` and ``estimate --check-golden``; the full tables go
behind ``--details`` or into a report file whose path the block names (``write_report``). On a terminal
the verdict is coloured (``rich``); in a log (CI, ``| tee``) and under ``NO_COLOR`` it is plain text.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from harness.config.revisions import collect_revisions
from harness.files import check_output, write_text_atomic

# The width of the key column: "unmeasured" is the longest key the commands use.
_KEY_WIDTH = 11
REPORT_HEADER = "<!-- recompute-harness report -->"
# Where reports go when no --report names a file: $RECOMPUTE_HARNESS_REPORT_DIR, else runs/ (as `run`'s
# sweeps) under the working directory.
REPORT_DIR_ENV = "RECOMPUTE_HARNESS_REPORT_DIR"


@dataclass
class Summary:
    """A command's verdict block. ``facts`` are (key, lines): the first line beside the key, the
    rest indented under it."""

    command: str
    subject: str
    passed: bool
    verdict: str
    wall_s: float
    facts: list[tuple[str, list[str]]] = field(default_factory=list)

    def add(self, key: str, *lines: str) -> None:
        """One fact; nothing when ``lines`` is empty (a block says only what was found)."""
        if lines:
            self.facts.append((key, list(lines)))

    def lines(self) -> list[str]:
        out = [f"== {self.command}: {self.subject}"]
        for key, values in self.facts:
            out.append(f"{key:<{_KEY_WIDTH}}{values[0]}")
            out += [f"{'':<{_KEY_WIDTH}}{value}" for value in values[1:]]
        out.append(f"{self.outcome}: {self.verdict}; {self.wall_s:.0f} s")
        return out

    @property
    def outcome(self) -> str:
        return "PASS" if self.passed else "FAIL"


def revision_subject(attention_backend: str | None = None) -> str:
    """``megatron-core 0.19.2 (commit …, fingerprint …), torch 2.14.1[, CPU, unfused attention]``."""
    revisions = collect_revisions()
    core: dict[str, Any] = revisions["megatron_core"] or {}
    pins = ", ".join(
        f"{key} {str(core[key])[:16]}" for key in ("commit", "fingerprint") if core.get(key)
    )
    where = f", CPU, {attention_backend} attention" if attention_backend else ""
    return (
        f"megatron-core {core.get('version', '?')}"
        + (f" ({pins})" if pins else "")
        + f", torch {revisions['torch']}{where}"
    )


def _colour(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR")


def print_summary(summary: Summary, stream: TextIO | None = None) -> None:
    """Print the block (after a blank line); the verdict line coloured on a terminal."""
    stream = sys.stdout if stream is None else stream
    *body, last = summary.lines()
    print("\n" + "\n".join(body), file=stream)
    if not _colour(stream):
        print(last, file=stream)
        return
    style = "bold green" if summary.passed else "bold red"
    text = Text(summary.outcome, style=style) + Text(last[len(summary.outcome) :])
    Console(file=stream, highlight=False, soft_wrap=True).print(text)


class PassProgress:
    """A progress bar of finished passes on stderr when it is a terminal; nothing in a log, where the
    block says everything at the end. Used as a context manager; ``advance`` is the callback."""

    def __init__(self, what: str, total: int) -> None:
        self._total = total
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        if _colour(sys.stderr):
            self._bar = Progress(
                TextColumn(what),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )

    def __enter__(self) -> Self:
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task("", total=self._total)
        return self

    def advance(self, name: str, finished: int, total: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=finished, total=total, description=name)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()


def default_report_path(command: str) -> Path:
    """``<report dir>/<command>-<UTC time>.md``: a new file each run, never one that exists."""
    directory = Path(os.environ.get(REPORT_DIR_ENV) or "runs")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"{command}-{stamp}.md"
    suffix = 1
    while path.exists():
        suffix += 1
        path = directory / f"{command}-{stamp}-{suffix}.md"
    return path


def check_report_path(path: Path) -> None:
    """Refuse (before any work) a report path that is a directory or a file this harness did not
    write: one line, exit 2."""
    check_output(path, False, lambda head: head.startswith(REPORT_HEADER.encode()), "report")


def write_report(path: Path, markdown: str) -> None:
    """Write the full tables atomically, marked as ours so the next run may replace them."""
    write_text_atomic(path, f"{REPORT_HEADER}\n{markdown.rstrip()}\n")
