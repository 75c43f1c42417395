"""The probe's verdict block: the revision judged, the passes and rows measured, the goldens matched or
differing (the first difference named), the labels no model measured (each reason once), the models
this tree cannot build, and PASS / FAIL in words."""

from __future__ import annotations

from collections.abc import Sequence

from harness.golden.probe import GoldenStep, probe_refresh_command
from harness.probe.present.coverage import unmeasured_everywhere
from harness.probe.runner import ModelProbe, probe_errors
from harness.report.changes import CHANGED_LABEL_LINES, first_change, label_lines
from harness.report.summary import Summary, revision_subject

# Golden outcomes in the order the block counts them (``harness.golden.probe.PassVerdict.outcome``).
_OUTCOME_WORDS = (
    ("matches", "match"),
    ("same-behaviour", "same behaviour (a new revision, no value changed)"),
    ("wrote", "written"),
    ("unchanged", "unchanged (already equal)"),
    ("differs", "differ"),
    ("not-written", "not written (rows raised)"),
)


def _count(values: Sequence[str], noun: str) -> str:
    return f"{len(values)} {noun}{'' if len(values) == 1 else 's'} ({', '.join(values)})"


def _judged(probes: Sequence[ModelProbe]) -> str:
    single = [p for p in probes if p.pipeline_parallel == 1 and p.tensor_parallel == 1]
    spread = [p for p in probes if p.pipeline_parallel > 1 or p.tensor_parallel > 1]
    measured = sum(row.measured for probe in probes for row in probe.rows)
    ends = f" = {len(probes)} passes, {measured} rows measured"
    if not single:
        return _on_layout(spread) + ends
    models = list(dict.fromkeys(probe.model for probe in single))
    precisions = list(dict.fromkeys(probe.precision for probe in single))
    backends = list(dict.fromkeys(probe.attention_backend for probe in single))
    said = (
        f"{len(models)} model{'' if len(models) == 1 else 's'} x {_count(precisions, 'precision')}"
    )
    if len(backends) > 1:
        said += f" x {_count(backends, 'attention back end')}"
    layouts: dict[str, list[str]] = {}
    for probe in spread:
        name = (
            f"PP {probe.pipeline_parallel}"
            if probe.pipeline_parallel > 1
            else f"TP {probe.tensor_parallel} + SP"
        )
        models_of = layouts.setdefault(name, [])
        models_of += [probe.model] if probe.model not in models_of else []
    said += "".join(f" + {name} of {', '.join(names)}" for name, names in layouts.items())
    return said + ends


def _on_layout(probes: Sequence[ModelProbe]) -> str:
    """A multi-rank probe of its own (``--pipeline-parallel`` / ``--tensor-parallel``)."""
    models = list(dict.fromkeys(probe.model for probe in probes))
    precisions = list(dict.fromkeys(probe.precision for probe in probes))
    pipeline = max(probe.pipeline_parallel for probe in probes)
    layout = (
        f" on {pipeline} pipeline stages"
        if pipeline > 1
        else f" on TP {max(probe.tensor_parallel for probe in probes)} + sequence parallel"
    )
    return (
        f"{len(models)} model{'' if len(models) == 1 else 's'} x {_count(precisions, 'precision')}"
        + layout
    )


def _unmeasured(probes: Sequence[ModelProbe]) -> list[str]:
    """One line per label and reason, naming the models that gave it (precisions folded)."""
    lines = []
    for label, entries in unmeasured_everywhere(list(probes)).items():
        reasons: dict[str, list[str]] = {}
        by_pass = {probe.pass_name: probe.model for probe in probes}
        for pass_name, entry in entries:
            rule = f" [{entry['rule']}]" if entry.get("rule") else ""
            why = f"{entry['status']}{rule}: {entry.get('reason') or '-'}"
            models = reasons.setdefault(why, [])
            if by_pass.get(pass_name, pass_name) not in models:
                models.append(by_pass.get(pass_name, pass_name))
        for why, models in reasons.items():
            status, _, reason = why.partition(": ")
            lines.append(f"{label}: {status} on {', '.join(models)}: {reason}")
    return lines


def _goldens(step: GoldenStep) -> tuple[list[str], str | None]:
    """(the block's golden lines, the first difference) for a check or write: the first changed value
    as ``model: label: metric golden -> actual``, and whose goldens were judged where these revisions
    have none of their own, said once."""
    counts = [
        f"{sum(v.outcome == outcome for v in step.verdicts)} {words}"
        for outcome, words in _OUTCOME_WORDS
        if any(v.outcome == outcome for v in step.verdicts)
    ]
    lines = [f"of {len(step.verdicts)}: " + ", ".join(counts)]
    others = list(dict.fromkeys(v.against_words for v in step.verdicts if v.against is not None))
    if others:
        mine = sum(v.against is None for v in step.verdicts)
        lines.append(
            f"judged against the golden(s) of {', '.join(others)}: "
            + ("this tree has none of its own" if not mine else f"{mine} pass(es) had their own")
        )
    first = next((v for v in step.verdicts if v.outcome in ("differs", "not-written")), None)
    if first is None:
        first = next((v for v in step.verdicts if v.problems), None)
    if first is None:
        return lines, None
    change = first_change(first.changes)
    named = change.line() if change is not None else f"{first.probe.pass_name}: {first.problems[0]}"
    lines.append(f"first: {named}")
    more = sum(len(v.problems) for v in step.verdicts) - 1
    if first.outcome == "differs":
        more -= 1  # the refresh line is not a difference
        lines.append(f"refresh if intended: {probe_refresh_command(first.probe)}")
    if more > 0:
        lines.append(f"{more} more line(s) in the report")
    return lines, named


def probe_summary(
    probes: Sequence[ModelProbe],
    *,
    command: str,
    wall_s: float,
    golden: GoldenStep | None,
    checking: bool,
    not_probed: Sequence[str] = (),
    adapter_drift: Sequence[str] = (),
    report: str | None = None,
) -> Summary:
    """The block for one probe run; ``checking``: the goldens were judged (not written)."""
    backends = list(dict.fromkeys(probe.attention_backend for probe in probes))
    summary = Summary(
        command=command,
        subject=revision_subject(", ".join(backends) if backends else None),
        passed=True,
        verdict="",
        wall_s=wall_s,
    )
    summary.add("judged", _judged(probes))
    first = None
    if golden is not None:
        lines, first = _goldens(golden)
        summary.add("goldens", *lines)
        changes = [change for verdict in golden.verdicts for change in verdict.changes]
        summary.add("changed", *label_lines(changes, CHANGED_LABEL_LINES))
    else:
        summary.add("goldens", "not judged (--check-golden judges them)")
    errors = probe_errors(list(probes))
    if errors:
        summary.add(
            "raised", f"{len(errors)} row(s) (status error; the rest was probed)", errors[0]
        )
    findings = golden.checkpoint_findings if golden is not None else ()
    summary.add("checkpoint", *findings)
    summary.add("not judged", *(golden.not_judged if golden is not None else ()))
    summary.add("unmeasured", *_unmeasured(probes))
    summary.add("not probed", *(line.removeprefix("not probed here: ") for line in not_probed))
    summary.add("adapter", *(f"replaced object changed since review: {d}" for d in adapter_drift))
    summary.add("report", report or "printed above (--details)")
    total = len(golden.verdicts) if golden is not None else 0
    if errors:
        summary.passed = False
        summary.verdict = f"{len(errors)} row(s) raised: {errors[0]}"
    elif findings and checking:
        summary.passed = False
        summary.verdict = findings[0]
    elif golden is not None and golden.differs:
        bad = sum(
            v.outcome in ("differs", "not-written") or bool(v.problems) for v in golden.verdicts
        )
        summary.passed = not checking and not any(
            v.outcome == "not-written" for v in golden.verdicts
        )
        summary.verdict = (
            f"{bad} of {total} golden(s) differ; first: {first}"
            if checking
            else f"goldens written with changes ({len(golden.written)} file(s)); first: {first}"
        )
    elif golden is not None and checking and any(v.against is not None for v in golden.verdicts):
        others = ", ".join(
            dict.fromkeys(v.against_words for v in golden.verdicts if v.against is not None)
        )
        summary.verdict = (
            f"same behaviour as the goldens of {others}: no value changed ({total}/{total})"
        )
    elif golden is not None and checking:
        summary.verdict = f"recompute behaviour matches its goldens ({total}/{total})"
    elif golden is not None:
        summary.verdict = (
            f"{len(golden.written)} golden(s) written, {total - len(golden.written)} unchanged"
        )
    else:
        summary.verdict = f"{len(probes)} pass(es) probed; no golden judged"
    return summary
