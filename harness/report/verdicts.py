"""The verdict blocks of ``diff`` and ``estimate --check-golden`` (the probe's: ``probe_summary``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.golden.estimate import EstimateMismatch
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
    summary.add(
        "values",
        f"{len(found.changes)} changed" if found.changes else "none changed",
        *found.changes[:1],
    )
    if not found.changed:
        same = (
            found.sides[0]["identity"]["fingerprint"] == found.sides[1]["identity"]["fingerprint"]
        )
        summary.verdict = "same behaviour" + (
            " (identical recompute sources)" if same else " (new fingerprint, no value changed)"
        )
        return summary
    first = [
        *(f"label {label} added" for label in found.labels_added),
        *(f"label {label} removed" for label in found.labels_removed),
        *(f"rule {rule} appeared" for rule in found.rules_appeared),
        *(f"rule {rule} vanished" for rule in found.rules_vanished),
        *found.changes,
    ]
    summary.verdict = f"behaviour changed; first: {first[0]}"
    return summary


def estimate_summary(
    recipe: str,
    golden_file: Path,
    mismatches: list[EstimateMismatch],
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
        summary.add("golden", f"{len(mismatches)} figure(s) differ", mismatches[0].line())
        summary.verdict = f"{len(mismatches)} figure(s) differ; first: {mismatches[0].line()}"
    else:
        summary.add("golden", "every figure matches")
        summary.verdict = "every row's estimate matches its golden"
    return summary
