"""A recipe sweep: the matched ``[]`` control first, then one change per row, one torchrun job per row.

Layout of a sweep directory (``--out``)::

    <out>/<recipe>-<UTC time>/
        records/<row>.json            one run record per row (written atomically, also for failures)
        rows/<row>/spec.json          what the workers ran (recipe as data, row)
        rows/<row>/events/rankN.jsonl each rank's phases, iterations, errors
        rows/<row>/torchrun/nodeK/... each rank's stdout.log, stderr.log, error.json
        rows/<row>/launcherK.log      torchrun's (or srun's) own output

Everything a user can get wrong (packages, devices, layout, rows, faults) is refused before the
first launch.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from harness.config.fields import CONTROL_ROW, RecomputeFields, require_known
from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.files import ensure_dir, write_json_atomic
from harness.processes import exit_cause, exit_if_stopped
from harness.record.io import write_record, write_sweep_plan
from harness.record.model import Record
from harness.record.step_time import in_round
from harness.run.assemble import StackDisagreement, build_record, ranks_revisions
from harness.run.classify import Classification, against_control, classify
from harness.run.environment import declared_environment
from harness.run.events import SPEC_FILE, RankEvidence, read_row
from harness.run.faults import FAULT_ENV, Fault
from harness.run.preflight import check_bridge_rows
from harness.run.recipes import Recipe, check_packages
from harness.run.torchrun import LaunchResult, local_commands, run_row, slurm_command


class Progress(Protocol):
    def row_started(self, row: str) -> None: ...
    def poll(self, row: str, ranks: list[RankEvidence], elapsed_s: float) -> None: ...
    def row_finished(self, row: str, outcome: Classification, elapsed_s: float) -> None: ...


@dataclass
class RowResult:
    row: str
    row_dir: Path
    record_path: Path
    record: Record
    outcome: Classification
    launch: LaunchResult


def row_slug(row: str) -> str:
    return "control" if row == CONTROL_ROW else row


def sweep_rows(recipe: Recipe, rows: list[str] | None) -> list[str]:
    """The rows to run, control first; ``--rows`` may name rows outside the recipe's list."""
    chosen = (
        list(recipe.rows) if rows is None else [CONTROL_ROW] + [r for r in rows if r != CONTROL_ROW]
    )
    if len(set(chosen)) != len(chosen):
        raise UsageError(f"duplicated row in {chosen}")
    for row in chosen:
        RecomputeFields.parse(row)
    return chosen


@dataclass(frozen=True)
class Launcher:
    """``local``: every node's torchrun on this host. ``slurm``: one srun step per row, torchrun per node,
    the c10d rendezvous on ``rdzv_endpoint`` (the job's first node), from inside an sbatch allocation."""

    kind: str = "local"
    rdzv_endpoint: str | None = None
    python: str = "python"
    srun_args: tuple[str, ...] = ()  # e.g. pyxis --container-image, from `launch --container-image`
    # The stack the ranks are launched into as the in-container preflight saw it (``run --preflighted``):
    # the package, label, device and Bridge checks ran there, and the records' pins must match it.
    # None: the ranks share this runner's interpreter stack, which is checked here.
    preflight_revisions: dict[str, Any] | None = None

    def expected_stack(self) -> tuple[dict[str, Any], str]:
        """(the revisions every rank must report, who saw them before launch)."""
        if self.preflight_revisions is not None:
            return self.preflight_revisions, "the in-container preflight"
        return collect_revisions(), "the runner"

    def commands(self, recipe: Recipe, row_dir: Path, rdzv_id: str) -> list[list[str]]:
        if self.kind == "local":
            return local_commands(row_dir, recipe.nnodes, recipe.nproc_per_node, rdzv_id)
        host, _, port = (self.rdzv_endpoint or "").rpartition(":")
        return [
            slurm_command(
                row_dir,
                recipe.nnodes,
                recipe.nproc_per_node,
                rdzv_id,
                host,
                int(port),
                self.python,
                self.srun_args,
            )
        ]


def check_labels(rows: list[str]) -> None:
    """Every selective label must be one the installed Megatron Core validator accepts."""
    from harness.config.labels import accepted_labels

    known = accepted_labels()
    for row in rows:
        require_known(RecomputeFields.parse(row).modules or (), known, f"row {row!r}")


def check_launchable(
    recipe: Recipe,
    faults: Sequence[Fault],
    launcher: Launcher = Launcher(),
    rows: list[str] | None = None,
) -> None:
    """Packages, labels, devices, fault ranks and (bridge) Bridge's own config validation — the checks
    that need this machine, before any launch. With ``launcher.preflight_revisions`` the stack checks
    (packages, labels, devices, Bridge) already ran inside the ranks' container, and this interpreter
    (the batch node's, outside it) may not even hold that stack: only the launch's own inputs are checked."""
    for fault in faults:  # user input, refused before any package or device check
        fault.check_backend(recipe.backend)
    in_this_python = launcher.preflight_revisions is None
    if in_this_python:
        check_packages(recipe)
        check_labels(sweep_rows(recipe, rows))
    if launcher.kind == "slurm":
        host, _, port = (launcher.rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(
                "the slurm launcher needs --rdzv-endpoint HOST:PORT (the job's first node)"
            )
    if recipe.device == "cuda" and in_this_python:
        import torch

        if not torch.cuda.is_available():
            raise UsageError(
                f"recipe {recipe.name!r} needs CUDA GPUs; this machine has none (CPU recipes: cpu-*)"
            )
        if recipe.nnodes > 1 and launcher.kind == "local":
            raise UsageError(
                f"recipe {recipe.name!r} spans {recipe.nnodes} nodes: write its job with "
                f"`recompute-harness launch --slurm --recipe {recipe.name}`"
            )
        found = torch.cuda.device_count()
        if found < recipe.nproc_per_node:
            raise UsageError(
                f"recipe {recipe.name!r} needs {recipe.nproc_per_node} GPUs per node; {found} visible"
            )
    chosen = sweep_rows(recipe, rows)
    for fault in faults:
        if fault.row is not None and fault.row not in chosen:
            raise UsageError(
                f"fault {fault.spec()!r}: row {fault.row!r} is not in this sweep ({', '.join(chosen)})"
            )
        if fault.rank >= recipe.world_size:
            raise UsageError(
                f"fault {fault.spec()!r}: rank {fault.rank} is outside the {recipe.world_size}-rank world"
            )
        if fault.iteration > recipe.train_iters:
            raise UsageError(
                f"fault {fault.spec()!r}: the recipe runs {recipe.train_iters} iterations"
            )
    if recipe.backend == "bridge" and in_this_python:
        check_bridge_rows(recipe, sweep_rows(recipe, rows))


def record_file(row: str, round_number: int | None = None) -> str:
    """Where a row's record goes, relative to its sweep directory (one per round in rounds)."""
    return f"records/{job_slug(row, round_number)}.json"


def job_slug(row: str, round_number: int | None) -> str:
    """A job's name in its sweep: the row's, led by its round in a sweep of rounds."""
    return row_slug(row) if round_number is None else f"r{round_number}-{row_slug(row)}"


def round_order(rows: Sequence[str], round_number: int) -> list[str]:
    """Round ``round_number`` (1-based) runs ``rows`` rotated by ``round_number - 1``: over as many
    rounds as rows each row runs first once and in every position once (a Latin-square rotation), so
    no row always meets the machine's first-job state or the same predecessor's leftovers."""
    shift = (round_number - 1) % len(rows)
    return [*rows[shift:], *rows[:shift]]


def sweep_jobs(rows: Sequence[str], rounds: int | None) -> list[tuple[str, int | None]]:
    """(row, round) in the order they run; ``rounds`` None: one job per row, the control first."""
    if rounds is None:
        return [(row, None) for row in rows]
    return [(row, number) for number in range(1, rounds + 1) for row in round_order(rows, number)]


def sweep_dir(out: Path, recipe: Recipe) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return ensure_dir(Path(out) / f"{recipe.name}-{stamp}-{uuid.uuid4().hex[:6]}")


def run_sweep(
    recipe: Recipe,
    out: Path,
    *,
    rows: list[str] | None = None,
    faults: Sequence[Fault] = (),
    timeout_s: float | None = None,
    stall_timeout_s: float | None = None,
    progress: Progress | None = None,
    launcher: Launcher = Launcher(),
    checked: bool = False,
    rounds: int | None = None,
) -> tuple[Path, list[RowResult]]:
    """Run the rows; ``checked``: the caller has already run ``check_launchable`` (it costs a bridge
    recipe two child processes, ~30 s). ``rounds``: every row that many times, each round in rotated
    order (``round_order``), each job's record marked with its round (step time is judged in rounds,
    harness.record.step_time); None: one job per row."""
    chosen = sweep_rows(recipe, rows)
    if rounds is not None and rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {rounds}")
    jobs = sweep_jobs(chosen, rounds)
    if not checked:
        check_launchable(recipe, faults, launcher, rows)
    timeout_s = recipe.timeout_s if timeout_s is None else timeout_s
    stall_timeout_s = recipe.stall_timeout_s if stall_timeout_s is None else stall_timeout_s
    # Declared once, before the first row: what Bridge (or anything else in this process) writes into
    # os.environ later never reaches a row unrecorded (harness.run.environment). Under srun the ranks'
    # environment is the batch step's (a container image adds its own): recorded, not declared here.
    declared = declared_environment(os.environ) if launcher.kind == "local" else None
    directory = sweep_dir(out, recipe)
    try:
        write_sweep_plan(
            directory,
            recipe.name,
            {
                row if number is None else f"{row} (round {number})": record_file(row, number)
                for row, number in jobs
            },
        )
    except (
        UsageError
    ):  # nothing of this sweep reached the disk (a full one): leave no empty sweep behind
        directory.rmdir()
        raise
    results: list[RowResult] = []
    control: Classification | None = None
    for row, number in jobs:
        exit_if_stopped()
        result = run_one_row(
            recipe,
            row,
            directory,
            round_number=number,
            fault=next((f for f in faults if f.applies_to(row)), None),
            timeout_s=timeout_s,
            stall_timeout_s=stall_timeout_s,
            control=control,
            progress=progress,
            launcher=launcher,
            declared=declared,
        )
        if row == CONTROL_ROW:
            control = result.outcome
        results.append(result)
    return directory, results


def run_one_row(
    recipe: Recipe,
    row: str,
    directory: Path,
    *,
    fault: Fault | None,
    timeout_s: float,
    stall_timeout_s: float,
    control: Classification | None,
    progress: Progress | None,
    launcher: Launcher = Launcher(),
    declared: dict[str, str] | None = None,
    round_number: int | None = None,
) -> RowResult:
    """One row under torchrun. ``declared``: the row's recorded environment, written into its spec, given
    to torchrun exactly and checked by every rank at its start (None: inherited, recorded as it is).
    ``round_number``: the round of a sweep in rounds this job is, kept in its record."""
    slug = job_slug(row, round_number)
    row_dir = directory / "rows" / slug
    ensure_dir(row_dir)
    spec = {
        "recipe": {**recipe.as_dict(), "timeout_s": timeout_s, "stall_timeout_s": stall_timeout_s},
        "row": row,
        **({} if declared is None else {"environment": declared}),
    }
    write_json_atomic(row_dir / SPEC_FILE, spec)
    if progress is not None:
        progress.row_started(row)
    commands = launcher.commands(recipe, row_dir, f"{recipe.name}-{slug}-{uuid.uuid4().hex[:8]}")
    provenance = {
        "source": "recompute-harness run: one torchrun job per row, per-rank evidence",
        "command": shlex.join(sys.argv),
        "notes": f"evidence: {row_dir}",
    }
    record_path = directory / record_file(row, round_number)
    try:
        launch = run_row(
            row_dir,
            commands,
            world_size=recipe.world_size,
            timeout_s=timeout_s,
            stall_timeout_s=stall_timeout_s,
            # Always set: a row without a fault must not inherit the caller's own RECOMPUTE_HARNESS_FAULT.
            env={FAULT_ENV: fault.spec() if fault is not None else ""},
            first_iteration_timeout_s=recipe.first_iteration_timeout_s,
            declared=declared,
            on_poll=None
            if progress is None
            else (lambda ranks, elapsed: progress.poll(row, ranks, elapsed)),
        )
    except (KeyboardInterrupt, SystemExit) as stop:  # run_row has stopped the row's processes
        _record_interrupted(
            recipe, row, row_dir, record_path, directory, stop, provenance, launcher
        )
        raise
    ranks = read_row(row_dir, recipe.world_size)
    outcome = classify(
        ranks,
        launch,
        train_iters=recipe.train_iters,
        row_dir=row_dir,
        stall_timeout_s=stall_timeout_s,
        timeout_s=timeout_s,
    )
    if (
        fault is not None
        and outcome.status == "completed"
        and not any(rank.fault_fired for rank in ranks)
    ):
        outcome = Classification(
            "crash",
            None,
            None,
            (),
            f"the injected fault {fault.spec()!r} never fired: the row "
            f"ran to the end untested ({outcome.message})",
        )
    if row != CONTROL_ROW:
        outcome = against_control(outcome, control)
    revisions = ranks_revisions(row, ranks, *launcher.expected_stack())
    record = build_record(recipe, row, ranks, outcome, revisions=revisions, provenance=provenance)
    if round_number is not None:
        record = in_round(record, round_number)
    write_record(record_path, record)
    if progress is not None:
        progress.row_finished(row, outcome, launch.elapsed_s)
    return RowResult(row, row_dir, record_path, record, outcome, launch)


INTERRUPTED_MARKER = "INTERRUPTED.json"


def _record_interrupted(
    recipe: Recipe,
    row: str,
    row_dir: Path,
    record_path: Path,
    directory: Path,
    stop: KeyboardInterrupt | SystemExit,
    provenance: dict[str, Any],
    launcher: Launcher,
) -> None:
    """The row the runner was stopped in gets its record (``interrupted``, where the ranks were), and
    the sweep a marker: nothing in the directory may look like a sweep that simply had fewer rows."""
    ranks = read_row(row_dir, recipe.world_size)
    unfinished = [rank for rank in ranks if not rank.done] or ranks
    behind = min(unfinished, key=lambda rank: rank.position)
    why = "SIGINT" if isinstance(stop, KeyboardInterrupt) else exit_cause(stop.code)
    outcome = Classification(
        "interrupted",
        behind.iteration if behind.phase else None,
        behind.phase,
        tuple(rank.rank for rank in unfinished),
        f"runner stopped by {why} while the row ran; its process tree was stopped",
    )
    expected, checked_by = launcher.expected_stack()
    try:
        revisions = ranks_revisions(row, ranks, expected, checked_by)
    except (
        StackDisagreement
    ):  # the stop is what this runner reports; the mixed stack stays in the evidence
        revisions = expected
    write_record(
        record_path,
        build_record(recipe, row, ranks, outcome, revisions=revisions, provenance=provenance),
    )
    write_json_atomic(
        directory / INTERRUPTED_MARKER,
        {
            "row": row,
            "record": str(record_path),
            "reason": why,
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )
