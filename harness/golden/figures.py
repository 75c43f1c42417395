"""Goldens judged figure by figure to the byte (estimate and capacity goldens, written from exact CPU
arithmetic): one figure that differs from its golden, and the line that names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FigureMismatch:
    """One figure that differs from the golden: ``where`` is ``workload``, ``plan``, ``row '<label>'``
    or a row's rank span."""

    where: str
    figure: str
    golden: Any
    actual: Any

    def line(self) -> str:
        delta = ""
        if isinstance(self.golden, int) and isinstance(self.actual, int) and self.golden:
            delta = f" ({(self.actual - self.golden) / abs(self.golden) * 100:+.2f} %)"
        return f"{self.where}: {self.figure} golden {self.golden!r}, now {self.actual!r}{delta}"
