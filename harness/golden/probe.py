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

from harness.cpu.attention import RECORD_NAMES
from harness.cpu.self_check import checkpoint_findings, require_working_adapter
from harness.errors import UsageError
from harness.files import require_writable_dir
from harness.golden.format import Golden, golden_from_records
from harness.golden.judge import Comparison, compare_records
from harness.golden.store import (
    directory_for,
    existing,
    golden_path_for,
    golden_root,
    load_golden,
    newest_like,
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
from harness.record.metrics import MetricName
from harness.record.model import ProbeMetrics, Record

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
    """(golden path, problems): ``judge_probe_golden`` without the earlier golden it matched."""
    path, problems, _ = judge_probe_golden(probe, root)
    return path, problems


def judge_probe_golden(
    probe: ModelProbe, root: Path | None = None
) -> tuple[Path, list[str], Path | None]:
    """(golden path, problems, same as): one readable line per changed value or unmeasured status;
    no problems when everything matches. For new pins (no golden for these revisions): the diff
    against the newest golden of the same model (the Megatron Core bump's per-label diff); when no
    value changed there, no problems and ``same as`` names that golden: a new revision, same behaviour."""
    records = probe_records(probe)
    path = golden_path_for(records, existing(golden_root(root)))
    unmeasured = unmeasured_entries(probe)
    if path.is_file():
        golden = load_golden(path)
        problems = _changed_values(compare_records(golden, records, str(path)))
        return path, problems + _unmeasured_changes(golden, unmeasured), None
    missing = f"no CPU golden {path.name} for these revisions"
    found = newest_like(
        path, (records[0].pins()["megatron_core"] or {}).get("version") if records else None
    )
    if found is None:
        return path, [missing], None
    # After a Megatron Core bump: show per label what changed against the last pinned golden.
    previous, golden = found
    changed = _changed_values(compare_records(golden, records, str(previous), across_pins=True))
    changed += _unmeasured_changes(golden, unmeasured)
    if not changed:
        return path, [], previous
    return (
        path,
        [missing, f"against {previous.name} (other revisions): {len(changed)} change(s)", *changed],
        None,
    )


def _unmeasured_key(entry: dict[str, Any]) -> tuple[str, str | None]:
    return entry["status"], entry.get("rule")


def _unmeasured_changes(golden: Golden, unmeasured: list[dict[str, Any]]) -> list[str]:
    """One line per label whose unmeasured status changed (goldens from before the list: every entry)."""
    before = {entry["label"]: entry for entry in golden.unmeasured or []}
    now = {entry["label"]: entry for entry in unmeasured}
    lines = []
    for label in sorted(set(before) | set(now)):
        old, new = before.get(label), now.get(label)
        if old is not None and new is not None and _unmeasured_key(old) == _unmeasured_key(new):
            continue
        if new is not None:
            lines.append(f"{label}: unmeasured: {describe_unmeasured(new)}")
        elif old is not None:
            lines.append(f"{label}: now measured (was unmeasured: {describe_unmeasured(old)})")
    return lines


def _changed_values(comparison: Comparison) -> list[str]:
    return [
        f"{check.label}: {check.metric} {check.golden} -> {check.actual} ({check.verdict})"
        for check in comparison.failures
    ]


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
    # matches / differs / same-behaviour (a new revision, no value changed against ``same_as``) /
    # wrote / unchanged (a write that found the golden equal) / not-written (rows raised)
    outcome: str
    problems: tuple[str, ...] = ()
    same_as: Path | None = None

    def lines(self) -> list[str]:
        """The step's report of this pass: a headline, then one indented line per problem."""
        model = self.probe.model
        if self.outcome == "not-written":  # the first problem says which rows raised
            head = f"{self.probe.pass_name}: not written: {self.problems[0]}"
            return [head, *(f"  {problem}" for problem in self.problems[1:])]
        if self.outcome in ("wrote", "unchanged"):
            head = f"{model}: {self.outcome} {self.golden}"
        elif self.outcome == "same-behaviour":
            assert self.same_as is not None
            head = (
                f"{model}: same behaviour: no golden {self.golden.name} for this new revision, "
                f"and no value changed against {self.same_as.name}"
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
        path, problems, same_as = judge_probe_golden(probe, golden_dir)
        raised = [row.label for row in probe.rows if row.status == ERROR]
        if write and raised:
            verdicts.append(
                PassVerdict(
                    probe,
                    path,
                    "not-written",
                    (f"{len(raised)} row(s) raised ({', '.join(raised)})", *problems),
                )
            )
        elif write:
            path, written = write_probe_golden(probe, golden_dir, adapter_drift=adapter_drift)
            verdicts.append(
                PassVerdict(probe, path, "wrote" if written else "unchanged", tuple(problems))
            )
        elif same_as is not None:
            verdicts.append(PassVerdict(probe, path, "same-behaviour", same_as=same_as))
        elif problems:
            refresh = "if the change is intended, refresh with: " + probe_refresh_command(probe)
            verdicts.append(PassVerdict(probe, path, "differs", (*problems, refresh)))
        else:
            verdicts.append(PassVerdict(probe, path, "matches"))
    findings = tuple(finding.line() for finding in checkpoint_findings())
    return GoldenStep(tuple(verdicts), findings, _not_judged(probes, verdicts, golden_dir))


_RECIPE = re.compile(
    r"cpu-probe-(?P<model>.+?)(?P<fused>-fused)?(?:-bf16)?"
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


def _not_judged(
    probes: list[ModelProbe], verdicts: list[PassVerdict], golden_dir: Path | None
) -> tuple[str, ...]:
    """This revision's CPU goldens that a run of every buildable model left unjudged, grouped by the
    command that judges them ("" for a run of some models only: naming the rest would be noise)."""
    if not verdicts or {p.model for p in probes} != set(buildable_models()):
        return ()
    judged = {v.golden.name for v in verdicts}
    pins = {v.golden.name.split("__", 1)[1] for v in verdicts}
    directory = directory_for("cpu-probe", golden_root(golden_dir))
    by_command: dict[str, list[str]] = {}
    for path in sorted(directory.glob("cpu-probe-*.json")):
        recipe, _, pin = path.name.partition("__")
        if pin in pins and path.name not in judged:
            by_command.setdefault(_judging_command(recipe), []).append(recipe)
    return tuple(f"{len(recipes)} golden(s): {command}" for command, recipes in by_command.items())
