"""Changed probe values on one screen: the first changed value, then one line per label collapsed
across models, precisions and layouts, saying what became of the label and by how much
(``core_attn: inactive on 7 models (replayed 1.7 to 5.1 MB -> 0, retained +6 to +19 %)``). The verdict blocks of
``probe``, ``diff`` and ``bump`` show these; every value stays in the report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.golden.figures import FigureMismatch
from harness.record.changes import MEASURED, STATUS, UNMEASURED, ValueChange
from harness.record.metrics import MetricName

# The most changed labels a block names one line each (the rest are counted; the report has them all):
# with the block's other lines it stays within one screen (25 lines).
CHANGED_LABEL_LINES = 6
# A row's status (or unmeasured entry) now, as what became of the label.
_STATUS_FATES = {
    "inactive": "inactive",
    "requires-TE": "inactive (requires-TE)",
    "rejected": "now rejected",
    "effective": "now active",
    MEASURED: "now measured",
}
_FAILED = ("error", "crash", "hang", "requires-CUDA")
# Values whose growth is a label's cost (replayed work) and whose shrinking is its saving.
_COST = (MetricName.REPLAY_BYTES, MetricName.BACKWARD_FLOPS, MetricName.REPLAY_OPS)
_BITWISE = (MetricName.NOT_BITWISE_VALUES, MetricName.DROPOUT_NOT_BITWISE_VALUES)


def _status_fate(status: str) -> str:
    word = status.split(":")[0].split(" [")[0]
    if word in _FAILED:
        return f"now fails ({word})"
    return _STATUS_FATES.get(word, f"now {word}")


def _direction(changes: Sequence[ValueChange], names: Sequence[str]) -> int:
    """+1 when the first of ``names`` that changed grew, -1 when it shrank, 0 when none changed."""
    for name in names:
        for change in changes:
            if change.metric == name and _numbers(change):
                return 1 if change.after > change.before else -1
    return 0


def _numbers(change: ValueChange) -> bool:
    return _numbers_of(change.before, change.after)


def _numbers_of(*values: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def fate(changes: Sequence[ValueChange]) -> str:
    """What became of one row in one pass, from its changed values: its new status when that changed
    (inactive, now fails, ...), else whether it saves and costs more or less."""
    by_metric = {change.metric: change for change in changes}
    if STATUS in by_metric:
        return _status_fate(str(by_metric[STATUS].after))
    if "row" in by_metric:
        return "not measured" if by_metric["row"].after == "missing" else "new row"
    if "outcome" in by_metric:
        return f"now {by_metric['outcome'].after}"
    words = []
    saving = _direction(changes, (MetricName.RETAINED_BYTES,))
    words += ["saves less"] if saving > 0 else ["saves more"] if saving < 0 else []
    cost = _direction(changes, _COST)
    words += ["costs more"] if cost > 0 else ["costs less"] if cost < 0 else []
    bitwise = _direction(changes, _BITWISE)
    words += ["no longer bitwise"] if bitwise > 0 else ["now bitwise"] if bitwise < 0 else []
    if UNMEASURED in by_metric and not words:
        return _status_fate(str(by_metric[UNMEASURED].after))
    return ", ".join(words) or "peaks moved"


def _bytes(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value / 1e6:.1f} MB" if abs(value) >= 1e6 else f"{value / 1e3:.0f} kB"


def _span(values: Sequence[float], shown: Callable[[float], str]) -> str:
    """``2.6 MB``, or over several passes ``1.7 to 2.6 MB`` (a unit said once when both share it)."""
    low, high = shown(min(values)), shown(max(values))
    if low == high:
        return low
    low_number, _, low_unit = low.partition(" ")
    if low_unit and high.endswith(" " + low_unit):
        low = low_number
    return f"{low} to {high}"


def _signed_pct(value: float) -> str:
    """``+6 %``, ``-3 %``; a change that rounds to nothing is ``0 %``, never ``-0 %``."""
    rounded = round(value)
    return f"{rounded:+d} %" if rounded else "0 %"


def _pct(change: ValueChange) -> float:
    return (change.after - change.before) / abs(change.before) * 100.0


def _by_how_much(changes: Sequence[ValueChange]) -> str:
    """The figures behind a label's line, over every pass: replayed bytes before -> after, retained
    bytes' relative change; backward FLOPs or a peak when nothing else moved."""

    def numeric(name: str) -> list[ValueChange]:
        return [c for c in changes if c.metric == name and _numbers(c)]

    parts = []
    replayed = numeric(MetricName.REPLAY_BYTES)
    if replayed:
        before = _span([c.before for c in replayed], _bytes)
        parts.append(f"replayed {before} -> {_span([c.after for c in replayed], _bytes)}")
    for name, words in (
        (MetricName.RETAINED_BYTES, "retained"),
        (MetricName.BACKWARD_FLOPS, "backward FLOPs"),
        (MetricName.PEAK_BACKWARD_BYTES, "backward peak"),
        (MetricName.PEAK_FORWARD_BYTES, "forward peak"),
    ):
        found = [c for c in numeric(name) if c.before]
        if found and (not parts or name == MetricName.RETAINED_BYTES):
            parts.append(f"{words} {_span([_pct(c) for c in found], _signed_pct)}")
    return f" ({', '.join(parts)})" if parts else ""


def first_change(changes: Sequence[ValueChange]) -> ValueChange | None:
    """The first changed value (a metric before a status, which the metrics explain)."""
    values = [c for c in changes if c.metric not in (STATUS, UNMEASURED)] or list(changes)
    return values[0] if values else None


def label_lines(changes: Sequence[ValueChange], limit: int) -> list[str]:
    """One line per changed label (a label set like ``mlp+core_attn`` is its own), most widely
    changed first, at most ``limit`` and a last line counting the rest."""
    rows: dict[str, dict[str, list[ValueChange]]] = {}
    for change in changes:
        rows.setdefault(change.label, {}).setdefault(change.where, []).append(change)
    lines = []
    ordered = sorted(rows.items(), key=lambda item: (-len(item[1]), "+" in item[0]))
    for label, passes in ordered:
        models_by_fate: dict[str, list[str]] = {}
        for found in passes.values():
            models = models_by_fate.setdefault(fate(found), [])
            models += [found[0].model] if found[0].model not in models else []
        said = "; ".join(
            f"{what} on {len(models)} model{'' if len(models) == 1 else 's'}"
            if len(models) > 1
            else f"{what} on {models[0]}"
            for what, models in models_by_fate.items()
        )
        flat = [change for found in passes.values() for change in found]
        lines.append(f"{label}: {said}{_by_how_much(flat)}")
    if len(lines) > limit:
        rest = len(lines) - limit + 1
        return [*lines[: limit - 1], f"{rest} more label(s) changed: every value is in the report"]
    return lines


def figure_lines(mismatches: Sequence[FigureMismatch], limit: int) -> list[str]:
    """For goldens judged figure by figure (estimate, capacity): one line per row (``where``) with
    each of its differing figures' relative change, at most ``limit`` and a last line counting the
    rest."""
    rows: dict[str, list[FigureMismatch]] = {}
    for mismatch in mismatches:
        rows.setdefault(mismatch.where, []).append(mismatch)
    lines = []
    for where, found in rows.items():
        figures = [
            f"{m.figure} {_signed_pct((m.actual - m.golden) / abs(m.golden) * 100.0)}"
            if _numbers_of(m.golden, m.actual) and m.golden
            else f"{m.figure} {m.golden!r} -> {m.actual!r}"
            for m in found
        ]
        lines.append(f"{where}: {', '.join(figures)}")
    if len(lines) > limit:
        rest = len(lines) - limit + 1
        return [*lines[: limit - 1], f"{rest} more row(s) changed: every figure is listed above"]
    return lines
