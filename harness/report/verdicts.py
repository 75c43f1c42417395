"""The verdict blocks of ``diff`` and ``estimate --check-golden`` (the probe's: ``probe_summary``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.golden.figures import FigureMismatch
from harness.report.changes import (
    CHANGED_LABEL_LINES,
    figure_lines,
    first_change,
    label_lines,
)
from harness.report.summary import Summary, revision_subject

if (
    TYPE_CHECKING
):  # tree_diff imports the matrix and with it torch, which estimate --help never pays
    from harness.compare.tree_diff import TreeDiff


def _side(side: dict[str, Any]) -> str:
    identity = side["identity"]
    pin = identity.get("commit") or identity.get("fingerprint") or "?"
    return f"megatron-core {identity['version']} ({str(pin)[:12]})"


def diff_summary(found: TreeDiff, *, wall_s: float) -> Summary:
    """What changed between the two trees, the first changed value named, and the verdict."""
    summary = Summary(
        command="diff",
        subject=f"A {_side(found.sides[0])} -> B {_side(found.sides[1])}",
        passed=not found.changed,
        verdict="",
        wall_s=wall_s,
    )
    summary.add("probed", f"{len(found.probed)} passes on both trees")
    for key, items in (
        (
            "labels",
            [f"+{label}" for label in found.labels_added]
            + [f"-{label}" for label in found.labels_removed],
        ),
        (
            "rules",
            [f"+{rule}" for rule in found.rules_appeared]
            + [f"-{rule}" for rule in found.rules_vanished],
        ),
    ):
        summary.add(key, ", ".join(items) if items else "same")
    first = first_change(found.changes)
    summary.add(
        "values",
        f"{len(found.changes)} changed" if found.changes else "none changed",
        *([f"first: {first.line()}"] if first is not None else []),
    )
    summary.add("changed", *label_lines(found.changes, CHANGED_LABEL_LINES))
    if not found.changed:
        same = (
            found.sides[0]["identity"]["fingerprint"] == found.sides[1]["identity"]["fingerprint"]
        )
        summary.verdict = "same behaviour" + (
            " (identical recompute sources)" if same else " (new fingerprint, no value changed)"
        )
        return summary
    named = [
        *(f"label {label} added" for label in found.labels_added),
        *(f"label {label} removed" for label in found.labels_removed),
        *(f"rule {rule} appeared" for rule in found.rules_appeared),
        *(f"rule {rule} vanished" for rule in found.rules_vanished),
        *([first.line()] if first is not None else []),
        *(f"recompute config field {name} added" for name in found.fields_added),
        *(f"recompute config field {name} removed" for name in found.fields_removed),
    ]
    summary.verdict = f"behaviour changed; first: {named[0]}"
    return summary


def estimate_summary(
    recipe: str,
    golden_file: Path,
    mismatches: list[FigureMismatch],
    *,
    rows: int,
    wall_s: float,
) -> Summary:
    """The estimate golden's verdict: every figure matched, or how many differ and the first."""
    summary = Summary(
        command=f"estimate --recipe {recipe} --check-golden",
        subject=revision_subject(),
        passed=not mismatches,
        verdict="",
        wall_s=wall_s,
    )
    summary.add("judged", f"{rows} rows against {golden_file.name}")
    if mismatches:
        summary.add(
            "golden", f"{len(mismatches)} figure(s) differ", f"first: {mismatches[0].line()}"
        )
        summary.add("changed", *figure_lines(mismatches, CHANGED_LABEL_LINES))
        summary.verdict = f"{len(mismatches)} figure(s) differ; first: {mismatches[0].line()}"
    else:
        summary.add("golden", "every figure matches")
        summary.verdict = "every row's estimate matches its golden"
    return summary


def plan_summary(
    workload: str,
    result: dict[str, Any],
    *,
    command: str,
    wall_s: float,
    golden_line: str | None = None,
    mismatches: Sequence[FigureMismatch] = (),
) -> Summary:
    """``plan``'s block: the rows judged by status, the chosen row (or that none fits), and the
    capacity golden's verdict when it was judged (each differing row once, with its figures)."""
    rows = result["rows"]
    statuses: dict[str, int] = {}
    for row in rows:
        kind = "fits" if row.get("fits") else str(row["status"]).split(" ")[0]
        statuses[kind] = statuses.get(kind, 0) + 1
    chosen = result.get("chosen")
    summary = Summary(
        command=command,
        subject=revision_subject(),
        passed=chosen is not None and (golden_line is None or golden_line.startswith("matches")),
        verdict="",
        wall_s=wall_s,
    )
    budget = result["budget_bytes"] / 1e9
    summary.add(
        "judged",
        f"{len(rows)} rows against {budget:.2f} GB per GPU: "
        + ", ".join(f"{count} {kind}" for kind, count in statuses.items()),
    )
    summary.add("chosen", chosen or "none: no row fits the budget with the margin")
    if golden_line is not None:
        summary.add("golden", golden_line)
        summary.add("changed", *figure_lines(mismatches, CHANGED_LABEL_LINES))
    if chosen is None:
        summary.verdict = f"no row of {workload} fits {budget:.2f} GB"
    elif golden_line is not None and not golden_line.startswith("matches"):
        summary.verdict = f"the plan differs from its capacity golden: {golden_line}"
    else:
        summary.verdict = f"{chosen} is the cheapest row that fits {budget:.2f} GB"
    return summary
