"""Probe rows as ``cpu-probe`` run records, and the CPU goldens they are compared with exactly: one
probe pass checks (and writes) every model's golden (``golden_step``).

One golden per style model per revision pin, under the golden root's cpu/ (``harness.golden.store``),
written only from a real probe
run. Rejected and hung rows carry no measurements, so they are not golden rows (the validator's
verdicts are pinned by the compatibility matrix; the deadlock by its own unit test).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config.revisions import collect_revisions
from harness.cpu.attention import RECORD_NAMES
from harness.cpu.self_check import checkpoint_findings, require_working_adapter
from harness.errors import UsageError
from harness.files import require_writable_dir
from harness.golden.format import Golden, describe_pins, golden_from_records
from harness.golden.judge import Comparison, compare_records
from harness.golden.store import (
    directory_for,
    existing,
    golden_path_for,
    golden_root,
    load_golden,
    newest_like,
    pin_slug,
    writable,
    write_golden,
)
from harness.models import buildable_models
from harness.probe.measurement.peaks import PHASES
from harness.probe.measurement.status import ERROR, Equivalence
from harness.probe.present.coverage import describe_unmeasured, unmeasured_entries
from harness.probe.runner import ModelProbe, ProbeRowResult
from harness.record.build import (
    cpu_probe_metrics,
    hardware,
    new_record,
    outcome,
    parallelism,
    workload,
)
from harness.record.changes import MEASURED, STATUS, UNMEASURED, ValueChange, activity
from harness.record.metrics import MetricName
from harness.record.model import ProbeMetrics, Record, Revisions

REFRESH_COMMAND = "./venv-run recompute-harness probe --all --write-golden"


def refresh_command(attention_backend: str = "unfused") -> str:
    """The one command that rewrites every golden of an attention back end (every precision)."""
    return REFRESH_COMMAND + (
        "" if attention_backend == "unfused" else f" --attention-backend {attention_backend}"
    )


def probe_refresh_command(probe: ModelProbe) -> str:
    """The command that rewrites ``probe``'s golden: ``refresh_command`` for a single-process pass; a
    pipeline stage's is its model's pipeline probe (every stage and precision of it), a TP pass's its
    model's TP probe (every precision)."""
    if probe.pipeline_parallel == 1 and probe.tensor_parallel == 1:
        return refresh_command(probe.attention_backend)
    layout = (
        f"--pipeline-parallel {probe.pipeline_parallel}"
        if probe.pipeline_parallel > 1
        else f"--tensor-parallel {probe.tensor_parallel}"
    )
    return (
        f"./venv-run recompute-harness probe --model {probe.model} {layout}"
        + (
            ""
            if probe.attention_backend == "unfused"
            else f" --attention-backend {probe.attention_backend}"
        )
        + " --write-golden"
    )


CPU_DEVICE, CPU_GPU_COUNT = "cpu", 0


def recipe_name(
    model: str,
    attention_backend: str = "unfused",
    precision: str = "fp32",
    pipeline_parallel: int = 1,
    stage: int = 0,
    tensor_parallel: int = 1,
) -> str:
    """``cpu-probe-<model>``; fused-attention and bf16 probes are their own recipes (and goldens):
    ``cpu-probe-<model>-fused``, ``cpu-probe-<model>-bf16``, ``cpu-probe-<model>-fused-bf16``, and
    each stage of a pipeline probe too: ``cpu-probe-<model>[-fused][-bf16]-pp<N>-stage<s>``, and a
    TP probe with sequence parallel (its ranks agree): ``cpu-probe-<model>[-fused][-bf16]-tp<N>-sp``.
    The unfused fp32 single-process name is the historical one, so existing goldens load."""
    return (
        f"cpu-probe-{model}"
        + ("" if attention_backend == "unfused" else f"-{attention_backend}")
        + ("" if precision == "fp32" else f"-{precision}")
        + ("" if pipeline_parallel == 1 else f"-pp{pipeline_parallel}-stage{stage}")
        + ("" if tensor_parallel == 1 else f"-tp{tensor_parallel}-sp")
    )


def _not_bitwise(equivalence: Equivalence) -> int:
    """How many of (loss, every parameter gradient) are not bit-identical to the control's."""
    return equivalence.differing_grads + (0 if equivalence.loss_equal else 1)


def row_metrics(row: ProbeRowResult) -> ProbeMetrics:
    values = row.values()
    carried = {} if row.carried_bytes is None else {MetricName.CARRIED_BYTES: row.carried_bytes}
    return cpu_probe_metrics(
        retained_bytes=values.retained_bytes,
        backward_flops=values.backward_flops,
        replay_bytes=values.replay_bytes,
        replay_ops=values.replay_ops,
        not_bitwise_values=_not_bitwise(values.equivalence),
        dropout_not_bitwise_values=_not_bitwise(values.dropout_equivalence),
        **carried,
        **{
            f"peak_{phase}_bytes": row.step_peaks[phase]["step_bytes"]
            for phase in PHASES
            if row.step_peaks
        },
        **({} if row.inflight_bytes is None else {MetricName.INFLIGHT_BYTES: row.inflight_bytes}),
    )


def probe_records(probe: ModelProbe, revisions: dict[str, Any] | None = None) -> list[Record]:
    """Validated ``cpu-probe`` records, one per measured row (rejected / hung rows have none)."""
    records = []
    recipe = recipe_name(
        probe.model,
        probe.attention_backend,
        probe.precision,
        probe.pipeline_parallel,
        probe.stage,
        probe.tensor_parallel,
    )
    for row in probe.rows:
        if not row.measured or row.add_bias_linear:
            continue
        records.append(
            new_record(
                "cpu-probe",
                workload=workload(
                    recipe=recipe,
                    model=probe.model,
                    backend="cpu-probe",
                    seq_length=probe.seq_length,
                    micro_batch_size=probe.micro_batch_size,
                    global_batch_size=probe.micro_batch_size,
                    precision=probe.precision,
                    attention_backend=RECORD_NAMES[probe.attention_backend],
                    train_iters=None,
                    parallelism=parallelism(tp=probe.tensor_parallel, pp=probe.pipeline_parallel),
                    extra={"probe_status": row.status},
                ),
                hardware=hardware(CPU_DEVICE, CPU_GPU_COUNT),
                recompute=row.fields,
                metrics=row_metrics(row),
                outcome=outcome(
                    "completed", message=f"{row.status}: {row.reason}" if row.reason else row.status
                ),
                revisions=revisions,
                record_id=f"{recipe}/{row.label}",
            )
        )
    return records


# Provenance that says when and where, not what: a rewrite that changes only these is no change.
VOLATILE_PROVENANCE = ("date", "host")


def _without_volatile(golden: dict[str, Any]) -> dict[str, Any]:
    provenance = {k: v for k, v in golden["provenance"].items() if k not in VOLATILE_PROVENANCE}
    return {**golden, "provenance": provenance}


def write_probe_golden(
    probe: ModelProbe, root: Path | None = None, *, adapter_drift: list[str] | None = None
) -> tuple[Path, bool]:
    """Write (atomically) the golden for this model and the installed revisions: (path, written).

    An existing golden that differs only in ``VOLATILE_PROVENANCE`` is left alone, byte for byte, so a
    refresh on an unchanged revision writes nothing. ``adapter_drift`` (the CPU adapter's replaced
    objects whose upstream source is not a reviewed one) is kept in the provenance when there is any.
    """
    records = probe_records(probe)
    path = golden_path_for(records, writable(golden_root(root)))
    golden = golden_from_records(
        records,
        {
            "source": "cpu probe run",
            "command": probe_refresh_command(probe),
            "host": socket.gethostname(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "gpu": None,
            "driver": None,
            **({"cpu_adapter_drift": adapter_drift} if adapter_drift else {}),
        },
    )
    golden.unmeasured = unmeasured_entries(probe)
    if path.is_file():
        try:
            if _without_volatile(load_golden(path).to_json()) == _without_volatile(
                golden.to_json()
            ):
                return path, False
        except UsageError:
            pass  # an unreadable golden is replaced
    write_golden(path, golden)
    return path, True


def check_probe_golden(probe: ModelProbe, root: Path | None = None) -> tuple[Path, list[str]]:
    """(golden path, problems): ``judge_probe_golden``'s report lines alone."""
    judged = judge_probe_golden(probe, root)
    return judged.path, list(judged.problems)


@dataclass(frozen=True)
class Judgement:
    """One probe pass against its CPU golden. ``path`` is the golden of these revisions (it may not
    exist); ``against`` another revision's golden judged instead (an edited tree, a pull request, a
    bump: the nearest golden of the same model, ``harness.golden.store.newest_like``); ``problems``
    the report's lines, ``changes`` the same findings as values."""

    path: Path
    problems: tuple[str, ...] = ()
    changes: tuple[ValueChange, ...] = ()
    against: Path | None = None
    # Whose golden ``against`` is, in words: "another fingerprint of 0.19.2 (a07a0245…)".
    against_words: str = ""

    @property
    def same_as(self) -> Path | None:
        """The other revision's golden this pass matched in every value (a new revision, same
        behaviour), if it was judged against one."""
        return self.against if self.against is not None and not self.problems else None


def judge_probe_golden(probe: ModelProbe, root: Path | None = None) -> Judgement:
    """The pass against the golden of these revisions: one readable line per changed value or
    unmeasured status, and the same as ``ValueChange``s; nothing when everything matches. For pins
    without a golden of their own: against the newest golden of the same model (the nearest
    revision first), whose pins are named once by ``against``; a pass with no such golden has the one
    problem that none exists."""
    records = probe_records(probe)
    path = golden_path_for(records, existing(golden_root(root)))
    unmeasured = unmeasured_entries(probe)
    against: Path | None = None
    against_words = ""
    if path.is_file():
        golden = load_golden(path)
        comparison = compare_records(golden, records, str(path))
    else:
        version = (records[0].pins()["megatron_core"] or {}).get("version") if records else None
        found = newest_like(path, version)
        if found is None:
            return Judgement(path, (f"no CPU golden {path.name} for these revisions",))
        against, golden = found
        comparison = compare_records(golden, records, str(against), across_pins=True)
        against_words = other_revision(golden.pins, records[0].pins())
    changes = _value_changes(probe, golden, comparison)
    status_changes = _unmeasured_changes(probe, golden, unmeasured)
    lines = [
        f"{check.label}: {check.metric} {check.golden} -> {check.actual} ({check.verdict})"
        for check in comparison.failures
    ]
    lines += [
        f"{change.label}: unmeasured: {change.after}"
        if change.after != MEASURED
        else f"{change.label}: now measured (was unmeasured: {change.before})"
        for change in status_changes
    ]
    return Judgement(path, tuple(lines), tuple(changes + status_changes), against, against_words)


def other_revision(golden_pins: dict[str, Any], pins: dict[str, Any]) -> str:
    """Whose a golden of other pins than ``pins`` is, in words: another fingerprint (or commit) of the
    same Megatron Core version, another version, or the same Megatron Core on another stack."""
    theirs, mine = golden_pins.get("megatron_core") or {}, pins.get("megatron_core") or {}
    identity = str(theirs.get("commit") or theirs.get("fingerprint") or "?")[:8]
    version = theirs.get("version") or "?"
    if all(theirs.get(key) == mine.get(key) for key in ("version", "commit", "fingerprint")):
        return f"another stack ({describe_pins(golden_pins)})"
    if version == mine.get("version"):
        kind = "commit" if theirs.get("commit") else "fingerprint"
        return f"another {kind} of {version} ({identity}…)"
    return f"megatron-core {version} ({identity}…)"


def _value_changes(probe: ModelProbe, golden: Golden, comparison: Comparison) -> list[ValueChange]:
    """Every failing check as a value, and, for each row whose values changed, its status when that
    changed too (before: read from the golden's values against its [] control; after: the probe's)."""
    where = probe.pass_name
    changes = [
        ValueChange(probe.model, where, check.label, check.metric, check.golden, check.actual)
        for check in comparison.failures
    ]
    golden_rows = {row.label: row for row in golden.rows}
    control = next((row for row in golden.rows if row.recompute.is_control), None)
    statuses = {row.label: row.status for row in probe.rows if not row.add_bias_linear}
    for label in dict.fromkeys(change.label for change in changes):
        before_row, after = golden_rows.get(label), statuses.get(label)
        if before_row is None or control is None or after is None or before_row is control:
            continue
        before = activity(before_row.values, control.values)
        if before != after:
            changes.append(ValueChange(probe.model, where, label, STATUS, before, after))
    return changes


def _unmeasured_key(entry: dict[str, Any]) -> tuple[str, str | None]:
    return entry["status"], entry.get("rule")


def _unmeasured_changes(
    probe: ModelProbe,
    golden: Golden,
    unmeasured: list[dict[str, Any]],
) -> list[ValueChange]:
    """One change per label whose unmeasured status changed (goldens from before the list: every
    entry), ``before`` / ``after`` the entry as the report describes it, or ``MEASURED``."""
    before = {entry["label"]: entry for entry in golden.unmeasured or []}
    now = {entry["label"]: entry for entry in unmeasured}
    changes = []
    for label in sorted(set(before) | set(now)):
        old, new = before.get(label), now.get(label)
        if old is not None and new is not None and _unmeasured_key(old) == _unmeasured_key(new):
            continue
        changes.append(
            ValueChange(
                probe.model,
                probe.pass_name,
                label,
                UNMEASURED,
                MEASURED if old is None else describe_unmeasured(old),
                MEASURED if new is None else describe_unmeasured(new),
            )
        )
    return changes


def refuse_unpinnable(*, write: bool, golden_dir: Path | None = None) -> list[str]:
    """Before anything is probed (the caller has already refused an MCore without an identity:
    ``harness.config.revisions.require_identity``, before importing this module and with it torch):
    a CPU adapter failing its behavioural self-check (``harness.cpu.self_check``) or (to write) a
    golden directory that cannot be written is one line and exit 2. Returns the replaced objects'
    drift lines (``harness.cpu.adapter.replaced_drift``): reported, never refused."""
    if write:
        require_writable_dir(directory_for("cpu-probe", golden_root(golden_dir)))
    return require_working_adapter("write CPU goldens" if write else "judge CPU goldens")


def adapter_drift_lines(drift: list[str]) -> list[str]:
    return [
        f"CPU adapter: a replaced upstream object changed since review: {line}" for line in drift
    ]


@dataclass(frozen=True)
class PassVerdict:
    """What the golden step found for one probe pass (a model at one precision, back end, layout)."""

    probe: ModelProbe
    golden: Path
    # matches / differs / same-behaviour (a new revision, no value changed against ``against``) /
    # wrote / unchanged (a write that found the golden equal) / not-written (rows raised)
    outcome: str
    problems: tuple[str, ...] = ()
    # The findings as values (``Judgement.changes``) and the other revision's golden they were judged
    # against, where these revisions have none of their own.
    changes: tuple[ValueChange, ...] = ()
    against: Path | None = None
    against_words: str = ""

    def lines(self) -> list[str]:
        """The step's report of this pass: a headline, then one indented line per problem."""
        model = self.probe.model
        if self.outcome == "not-written":  # the first problem says which rows raised
            head = f"{self.probe.pass_name}: not written: {self.problems[0]}"
            return [head, *(f"  {problem}" for problem in self.problems[1:])]
        if self.outcome in ("wrote", "unchanged"):
            head = f"{model}: {self.outcome} {self.golden}"
        elif self.outcome == "same-behaviour":
            assert self.against is not None
            head = (
                f"{model}: same behaviour: no golden {self.golden.name} for this new revision, "
                f"and no value changed against {self.against.name}"
            )
        elif self.against is not None:
            head = (
                f"{model}: DIFFERS from {self.against.name} ({self.against_words}: these "
                f"revisions have no golden of their own, {self.golden.name})"
            )
        else:
            head = f"{model}: {'matches' if self.outcome == 'matches' else 'DIFFERS from'} "
            head += self.golden.name
        return [head, *(f"  {problem}" for problem in self.problems)]


@dataclass(frozen=True)
class GoldenStep:
    """The golden step of one probe: a verdict per pass, in the passes' order."""

    verdicts: tuple[PassVerdict, ...]
    # Megatron Core's own checkpoint classes misbehaving under dropout, one line each naming the rows
    # that rely on them (``harness.cpu.self_check.checkpoint_findings``): a finding, never a refusal.
    checkpoint_findings: tuple[str, ...] = ()
    # After a run of every buildable model: this revision's goldens the run did not judge (other
    # layouts, the other attention back end), one line per command that judges them.
    not_judged: tuple[str, ...] = ()

    @property
    def differs(self) -> bool:
        """Whether any golden differed or could not be written, or a checkpoint class misbehaves."""
        return bool(self.checkpoint_findings) or any(
            v.outcome in ("differs", "not-written") or v.problems for v in self.verdicts
        )

    @property
    def written(self) -> list[str]:
        return [str(v.golden) for v in self.verdicts if v.outcome == "wrote"]

    def lines(self) -> list[str]:
        return [
            *self.checkpoint_findings,
            *(line for verdict in self.verdicts for line in verdict.lines()),
        ]


def golden_step(
    probes: list[ModelProbe],
    *,
    write: bool,
    golden_dir: Path | None = None,
    adapter_drift: list[str] | None = None,
) -> GoldenStep:
    """Check (and with ``write``, then write) each probe's CPU golden from this one probe pass.

    The diff against the golden being replaced (or, for new pins, the nearest earlier one) comes
    first, so a refresh probes once. A model with ``error`` rows gets no golden (it would pin their
    absence).
    """
    verdicts = []
    for probe in probes:
        judged = judge_probe_golden(probe, golden_dir)
        path, problems = judged.path, judged.problems
        raised = [row.label for row in probe.rows if row.status == ERROR]
        if write and raised:
            verdicts.append(
                PassVerdict(
                    probe,
                    path,
                    "not-written",
                    (f"{len(raised)} row(s) raised ({', '.join(raised)})", *problems),
                    judged.changes,
                    judged.against,
                    judged.against_words,
                )
            )
        elif write:
            path, written = write_probe_golden(probe, golden_dir, adapter_drift=adapter_drift)
            verdicts.append(
                PassVerdict(
                    probe,
                    path,
                    "wrote" if written else "unchanged",
                    problems,
                    judged.changes,
                    judged.against,
                    judged.against_words,
                )
            )
        elif judged.same_as is not None:
            verdicts.append(
                PassVerdict(
                    probe,
                    path,
                    "same-behaviour",
                    against=judged.against,
                    against_words=judged.against_words,
                )
            )
        elif problems:
            refresh = "if the change is intended, refresh with: " + probe_refresh_command(probe)
            verdicts.append(
                PassVerdict(
                    probe,
                    path,
                    "differs",
                    (*problems, refresh),
                    judged.changes,
                    judged.against,
                    judged.against_words,
                )
            )
        else:
            verdicts.append(PassVerdict(probe, path, "matches"))
    findings = tuple(finding.line() for finding in checkpoint_findings())
    return GoldenStep(tuple(verdicts), findings, _not_judged(probes, verdicts, golden_dir))


_RECIPE = re.compile(
    r"cpu-probe-(?P<model>.+?)(?P<fused>-fused)?(?P<bf16>-bf16)?"
    r"(?:-pp(?P<pp>\d+)-stage\d+)?(?:-tp(?P<tp>\d+)-sp)?"
)


def _judging_command(recipe: str) -> str:
    """The command that judges the CPU golden of ``recipe`` (a ``recipe_name``)."""
    parts = _RECIPE.fullmatch(recipe)
    if parts is None:
        return "./venv-run recompute-harness probe --all --check-golden"
    if parts["pp"] or parts["tp"]:
        layout = (
            f"--pipeline-parallel {parts['pp']}"
            if parts["pp"]
            else f"--tensor-parallel {parts['tp']}"
        )
        return (
            f"./venv-run recompute-harness probe --model {parts['model']} {layout} --check-golden"
        )
    backend = " --attention-backend fused" if parts["fused"] else ""
    return f"./venv-run recompute-harness probe --all{backend} --check-golden"


@dataclass(frozen=True)
class LayoutRun:
    """One multi-rank probe a revision has CPU goldens for: ``model`` on ``ranks`` pipeline stages
    (``layout`` "pipeline") or TP ranks with sequence parallel ("tensor"), at one back end and
    precision."""

    layout: str
    model: str
    ranks: int
    attention_backend: str
    precision: str


@dataclass(frozen=True)
class GoldenLayouts:
    """What one revision's CPU goldens cover: the attention back ends of its single-process passes and
    its multi-rank probes; ``pins`` their file names' pin part, ``count`` how many goldens those
    pins have."""

    pins: str
    count: int
    backends: tuple[str, ...]
    runs: tuple[LayoutRun, ...]


def _installed_pins() -> str:
    return pin_slug(Revisions.from_json(collect_revisions()).pins())


def layouts_to_judge(
    golden_dir: Path | None = None, *, every: bool = False
) -> GoldenLayouts | None:
    """Every layout and attention back end the CPU goldens of this revision cover, where the installed
    revisions have no CPU golden of their own (an edited tree, a pull request, a patched build): those
    of the nearest revision's goldens (``newest_like``'s choice: the same Megatron Core version first,
    then the newest). ``every``: the installed revisions' own, where they have goldens. None: judge
    the default set (the pinned tree, or no golden of any revision)."""
    directory = directory_for("cpu-probe", existing(golden_root(golden_dir)))
    by_pins: dict[str, list[Path]] = {}
    for path in sorted(directory.glob("cpu-probe-*.json")):
        parts = path.name.removesuffix(".json").split("__", 2)
        if len(parts) == 3:
            by_pins.setdefault(parts[2], []).append(path)
    own = _installed_pins()
    if not by_pins or (own in by_pins and not every):
        return None
    if own not in by_pins:
        version = Revisions.from_json(collect_revisions()).pins()["megatron_core"]["version"]

        def nearness(pins: str) -> tuple[bool, str]:
            golden = load_golden(by_pins[pins][0])
            return (golden.pins.get("megatron_core") or {}).get("version") == version, golden.date

        own = max(by_pins, key=nearness)
    backends: list[str] = []
    runs: list[LayoutRun] = []
    for path in by_pins[own]:
        recipe = _RECIPE.fullmatch(path.name.split("__", 1)[0])
        if recipe is None:
            continue
        backend = "fused" if recipe["fused"] else "unfused"
        precision = "bf16" if recipe["bf16"] else "fp32"
        if recipe["pp"] or recipe["tp"]:
            layout = "pipeline" if recipe["pp"] else "tensor"
            ranks = int(recipe["pp"] or recipe["tp"])
            runs.append(LayoutRun(layout, recipe["model"], ranks, backend, precision))
        else:
            backends.append(backend)
    # As probe orders its passes: the default back end and precision first.
    runs.sort(
        key=lambda run: (run.model, run.attention_backend != "unfused", run.precision != "fp32")
    )
    return GoldenLayouts(
        own, len(by_pins[own]), tuple(dict.fromkeys(backends)), tuple(dict.fromkeys(runs))
    )


def _not_judged(
    probes: list[ModelProbe], verdicts: list[PassVerdict], golden_dir: Path | None
) -> tuple[str, ...]:
    """This revision's CPU goldens that a run of every buildable model left unjudged, grouped by the
    command that judges them ("" for a run of some models only: naming the rest would be noise)."""
    if not verdicts or {p.model for p in probes} != set(buildable_models()):
        return ()
    # A tree without goldens of its own was judged on another revision's: those are the ones left.
    judged = {(v.golden if v.against is None else v.against).name for v in verdicts}
    pins = {name.split("__", 1)[1] for name in judged}
    directory = directory_for("cpu-probe", golden_root(golden_dir))
    by_command: dict[str, list[str]] = {}
    for path in sorted(directory.glob("cpu-probe-*.json")):
        recipe, _, pin = path.name.partition("__")
        if pin in pins and path.name not in judged:
            by_command.setdefault(_judging_command(recipe), []).append(recipe)
    return tuple(f"{len(recipes)} golden(s): {command}" for command, recipes in by_command.items())
