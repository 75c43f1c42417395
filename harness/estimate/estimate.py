"""``estimate``: per-rank retained activation bytes of every row of a GPU recipe, measured on CPU.

Method (docs/estimate.md):

1. One real MCore layer of each kind in the recipe's model (dense / MoE; a hybrid model's Mamba /
   attention / MoE / MLP layers, harness.estimate.model), at its real per-rank widths:
   the recipe's TP group runs for real (``torchrun`` on gloo, ``harness.estimate.worker``), sequence
   parallel on when TP > 1, experts emulated in-rank (same routed token copies per rank as EP gives).
2. Each row's layer is measured at three short sequence lengths; retained bytes (and their
   attribution per module) are extrapolated exactly to the recipe's sequence length
   (``harness.estimate.fit``: degree ≤ 2, the s² term being the unfused score matrix).
3. Per rank: the layers of the hot pipeline stage (stage 0, which holds ``min(pp, microbatches)``
   micro-batches in flight under 1F1B), each kind times its count. Under an interleaved pipeline
   (VPP) the totals still count 1F1B's in-flight micro-batches over the stage's share of layers:
   per layer they are exact, and ``plan`` composes the interleaved schedule from them
   (harness/plan/schedule.py). The hot rank is the TP rank with
   the most ``[]`` bytes (TP ranks are symmetric, so ties go to rank 0).

Scope: transformer layers only. The embedding, final norm, output layer and loss retain the same
bytes in every row (no label touches them), so savings are unaffected; absolute ``retained_bytes``
exclude them, and exclude everything that is not an activation (weights, gradients, optimizer state).
"""

from __future__ import annotations

import json
import re
import shlex
import socket
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from harness.config.fields import CONTROL_ROW, RecomputeFields
from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.estimate.fit import extrapolate, quadratic_coefficient
from harness.probe.measurement.status import (
    CONTROL_STATUS,
    EFFECTIVE,
    INACTIVE,
    REJECTED,
    REQUIRES_TE,
    MeasuredRow,
)
from harness.processes import run_cpu_torchrun, usable_cores
from harness.record.build import now_iso
from harness.record.metrics import MetricName
from harness.run.recipes import Parallelism, Recipe

PROBE_SEQ_LENGTHS = (64, 128, 256)
# A rank's allowance; ranks beyond the usable cores share them, and get it per core's share.
WORKER_TIMEOUT_S = 600.0
UNMEASURED = "unmeasured"  # the row statuses are the probe's (harness.probe.measurement.status), plus this one
# recipe attention_backend -> the probe's core attention (what GPU kernels keep: fused/flash/auto
# resolve to fused or flash attention on Hopper; both keep q, k, v, output and softmax statistics).
ATTENTION_FOR_RECIPE = {
    "fused": "fused",
    "flash": "fused",
    "auto": "fused",
    "local": "unfused",
    "unfused": "unfused",
}
_EXPERT_INDEX = re.compile(r"local_experts\.\d+")


@dataclass(kw_only=True)
class EstimateRow(MeasuredRow):
    """An estimated row: the shared verdict, plus the saving and where it comes from."""

    saving_bytes: int | None = None
    saving_pct: float | None = None
    partial_saving_bytes: int | None = (
        None  # requires-TE rows: what the labels that run on CPU save
    )
    per_kind: dict[str, dict[str, int]] = field(
        default_factory=dict
    )  # kind -> layers, retained, saving
    # Per module ("kind:path"), bytes [] retains there minus what this row retains there, largest first.
    # Negative entries are bytes that moved: a checkpoint's saved inputs are charged to the module
    # that ran the checkpoint, where [] charged them to the module that first saved them.
    removed: list[dict[str, Any]] = field(default_factory=list)
    attribution: dict[str, int] = field(
        default_factory=dict
    )  # the control only: retained bytes per module
    # The rank's activation peak: the layers retained up to the one whose forward or backward
    # transient (MemTracker, harness.estimate.layers.LayerPeaks) tops it, and where that is.
    peak_bytes: int | None = None
    peak_saving_bytes: int | None = None
    peak_phase: str = ""


@dataclass
class Estimate:
    recipe: str
    model: str
    source: str
    attention_backend: str
    precision: str
    seq_length: int
    micro_batch_size: int
    parallelism: dict[str, Any]
    hot_rank: int
    layers: dict[str, int]
    in_flight_microbatches: int
    probe_seq_lengths: list[int]
    score_bytes_per_s2: dict[
        str, float
    ]  # kind -> s² coefficient of []'s fit (0 under fused attention)
    scope: str
    rows: list[EstimateRow]
    revisions: dict[str, Any] = field(
        default_factory=dict
    )  # torch / megatron_core / transformer_engine
    provenance: dict[str, Any] = field(
        default_factory=dict
    )  # source, command, host, date of the run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EstimateTarget:
    """What the estimate measures: the workload's name, the layout and batch its layers run at, and
    the arguments a worker rank rebuilds the model from (``harness.estimate.worker``)."""

    name: str
    parallelism: Parallelism
    world_size: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    precision: str
    worker_source: tuple[str, ...]

    @classmethod
    def of_recipe(cls, recipe: Recipe) -> EstimateTarget:
        return cls(
            recipe.name,
            recipe.parallelism,
            recipe.world_size,
            recipe.seq_length,
            recipe.micro_batch_size,
            recipe.global_batch_size,
            recipe.precision,
            ("--recipe", recipe.name),
        )


def attention_backend_for(recipe: Recipe, override: str | None) -> str:
    if override is not None:
        return override
    try:
        return ATTENTION_FOR_RECIPE[recipe.attention_backend]
    except KeyError:
        raise UsageError(
            f"recipe {recipe.name!r}: attention_backend {recipe.attention_backend!r} has no CPU "
            f"counterpart (known: {', '.join(ATTENTION_FOR_RECIPE)})"
        ) from None


def check_estimable(recipe: Recipe) -> None:
    """Refuse, before any process starts, what the layer model cannot represent."""
    layout = recipe.parallelism
    where = f"recipe {recipe.name!r}"
    if recipe.device != "cuda":
        raise UsageError(f"{where} is a CPU recipe: run it (or probe it) instead of estimating it")
    if layout.cp != 1:
        raise UsageError(
            f"{where}: context parallel {layout.cp} is not modelled (the CPU core attentions have no CP)"
        )
    if layout.tp > 8:
        raise UsageError(
            f"{where}: TP {layout.tp} would start {layout.tp} CPU ranks here; at most 8 are run"
        )
    # The model itself (an unknown model, a hybrid pattern with a symbol no layer model covers, a
    # layer count the pattern contradicts). Imported here: it imports Megatron Core, which this
    # process otherwise never needs (the layers are built in the torchrun ranks).
    from harness.estimate.model import architecture

    architecture(recipe)


def measure_recipe(
    target: EstimateTarget,
    rows: list[str],
    attention_backend: str,
    seq_lengths: tuple[int, ...] = PROBE_SEQ_LENGTHS,
    timeout_s: float | None = None,
) -> list[dict[str, Any]]:
    """Run the TP ranks of the worker; their per-rank results."""
    if timeout_s is None:
        timeout_s = WORKER_TIMEOUT_S * max(1.0, target.parallelism.tp / usable_cores())
    child, texts = run_cpu_torchrun(
        target.parallelism.tp,
        "harness.estimate.worker",
        [
            *_worker_args(target, rows, attention_backend, seq_lengths),
            "--timeout",
            str(timeout_s),
        ],
        timeout_s=timeout_s,
    )
    if child is None:
        raise RuntimeError(f"the estimate's layer measurement ran past {timeout_s:.0f} s")
    results = [json.loads(text) for text in texts]
    failed = [r for r in results if "error" in r]
    if failed:
        error = failed[0]["error"]
        where = f" at {error['where']}" if error["where"] else ""
        raise RuntimeError(
            f"the estimate's layer measurement failed on rank {failed[0]['rank']}: "
            f"{error['type']}: {error['message']}{where}; reproduce with: "
            + shlex.join(worker_command(target, rows, attention_backend, seq_lengths))
        )
    if child.returncode != 0 or len(results) != target.parallelism.tp:
        # No rank reported an exception (one was killed, or torchrun itself failed): the last
        # line that is not the launcher's banner.
        lines = [
            line
            for line in child.stderr.strip().splitlines()
            if line.strip() and not set(line.strip()) <= {"=", "-"}
        ]
        raise RuntimeError(
            f"the estimate's layer measurement failed (exit {child.returncode}): "
            f"{(lines or ['no output'])[-1]}; reproduce with: "
            + shlex.join(worker_command(target, rows, attention_backend, seq_lengths))
        )
    return results


def worker_command(
    target: EstimateTarget, rows: list[str], attention_backend: str, seq_lengths: tuple[int, ...]
) -> list[str]:
    """The command that runs the measurement's ranks by hand (``--out`` a folder to write to)."""
    return [
        "torchrun",
        "--standalone",
        f"--nproc-per-node={target.parallelism.tp}",
        "-m",
        "harness.estimate.worker",
        *_worker_args(target, rows, attention_backend, seq_lengths),
        "--out",
        "OUT",
    ]


def _worker_args(
    target: EstimateTarget, rows: list[str], attention_backend: str, seq_lengths: tuple[int, ...]
) -> list[str]:
    """What the worker's ranks are given: the model, the rows, the sequence lengths, the back end."""
    return [
        *target.worker_source,
        "--rows",
        json.dumps(rows),
        "--seqs",
        ",".join(str(s) for s in seq_lengths),
        "--attention-backend",
        attention_backend,
    ]


def _at_target(
    measurements: list[dict[str, Any]], target: int
) -> tuple[Fraction, dict[str, Fraction]]:
    """A row's layer bytes and per-module attribution, extrapolated to ``target``."""
    lengths = [m["seq_length"] for m in measurements]
    total = extrapolate(lengths, [m[MetricName.RETAINED_BYTES] for m in measurements], target)
    modules: dict[str, list[int]] = defaultdict(lambda: [0] * len(measurements))
    for i, m in enumerate(measurements):
        for name, nbytes in m["attribution"].items():
            modules[_EXPERT_INDEX.sub("local_experts.*", name)][i] += nbytes
    return total, {name: extrapolate(lengths, values, target) for name, values in modules.items()}


def hot_stage_layers(layer_kinds: list[str], pp: int, where: str) -> dict[str, int]:
    """Layers of each kind on pipeline stage 0 (an even split, as MCore makes without a custom layout)."""
    if len(layer_kinds) % pp:
        raise UsageError(f"{where}: {len(layer_kinds)} layers do not split evenly over PP {pp}")
    counts: dict[str, int] = defaultdict(int)
    for kind in layer_kinds[: len(layer_kinds) // pp]:
        counts[kind] += 1
    return dict(counts)


def assemble(
    target: EstimateTarget,
    rows: list[str],
    attention_backend: str,
    results: list[dict[str, Any]],
    seq_lengths: tuple[int, ...] = PROBE_SEQ_LENGTHS,
) -> Estimate:
    """Per-rank results -> the estimate on the hot rank."""
    where = f"recipe {target.name!r}"
    first = results[0]
    layout = target.parallelism
    layers = hot_stage_layers(first["layer_kinds"], layout.pp, where)
    micro_batches = target.global_batch_size // (
        target.micro_batch_size * layout.data_parallel(target.world_size)
    )
    in_flight = min(layout.pp, micro_batches)

    def rank_total(result: dict[str, Any], row: str) -> Fraction | None:
        kinds = result["kinds"]
        if any(row not in kinds[kind] for kind in layers):
            return None
        return (
            sum(
                (
                    _at_target(kinds[kind][row], target.seq_length)[0] * count
                    for kind, count in layers.items()
                ),
                Fraction(0),
            )
            * in_flight
        )

    measured = [rank_total(result, CONTROL_ROW) for result in results]
    control_totals = [total for total in measured if total is not None]
    if len(control_totals) != len(measured):
        raise RuntimeError(
            f"{where}: the [] control could not be measured: "
            f"{first['rejected'].get(CONTROL_ROW, {}).get('message', 'no measurement')}"
        )
    hot = max(range(len(results)), key=lambda r: (control_totals[r], -r))
    result = results[hot]
    control_total = control_totals[hot]
    control_parts = {
        kind: _at_target(result["kinds"][kind][CONTROL_ROW], target.seq_length) for kind in layers
    }

    out_rows = [
        _row(row, result, layers, in_flight, target.seq_length, control_total, control_parts)
        for row in rows
    ]
    stage = result["layer_kinds"][: len(result["layer_kinds"]) // layout.pp]
    _add_peaks(out_rows, result, stage, in_flight, target.seq_length)
    score = (
        {
            kind: float(
                quadratic_coefficient(
                    list(seq_lengths),
                    [m[MetricName.RETAINED_BYTES] for m in result["kinds"][kind][CONTROL_ROW]],
                )
            )
            for kind in layers
        }
        if len(seq_lengths) == 3
        else {}
    )
    return Estimate(
        recipe=target.name,
        model=first["model"],
        source=first["source"],
        attention_backend=attention_backend,
        precision=target.precision,
        seq_length=target.seq_length,
        micro_batch_size=target.micro_batch_size,
        parallelism={
            "tp": layout.tp,
            "pp": layout.pp,
            "cp": layout.cp,
            "ep": layout.ep,
            "etp": layout.expert_tp,
            "sequence_parallel": layout.tp > 1,
        },
        hot_rank=hot,
        layers=layers,
        in_flight_microbatches=in_flight,
        probe_seq_lengths=list(seq_lengths),
        score_bytes_per_s2=score,
        scope="activations autograd retains at the end of forward in the transformer layers of the hot "
        "pipeline stage (embedding, output layer and loss excluded: no label changes them)",
        rows=out_rows,
    )


def rank_peak(
    result: dict[str, Any], row: str, stage: list[str], in_flight: int, target: int
) -> tuple[Fraction, str] | None:
    """The rank's activation peak under ``row`` and where it happens.

    At layer ``i`` of the stage (in order), forward and backward both have the layers up to ``i``
    retained (in forward the later ones have not run; in backward they are already freed) plus
    layer ``i``'s own transient; the other in-flight micro-batches keep the whole stage retained.
    """
    retained: dict[str, Fraction] = {}
    transients: dict[str, dict[str, Fraction]] = {}
    for kind in set(stage):
        measurements = result.get("peaks", {}).get(kind, {}).get(row)
        if not measurements or row not in result["kinds"][kind]:
            return None
        retained[kind] = _at_target(result["kinds"][kind][row], target)[0]
        lengths = [m["seq_length"] for m in measurements]
        transients[kind] = {
            phase: extrapolate(lengths, [m[f"{phase}_transient"] for m in measurements], target)
            for phase in ("forward", "backward")
        }
    others = sum((retained[kind] for kind in stage), Fraction(0)) * (in_flight - 1)
    largest: tuple[Fraction, str] | None = None
    prefix = Fraction(0)
    for index, kind in enumerate(stage):
        prefix += retained[kind]
        for phase, transient in transients[kind].items():
            value = others + prefix + transient
            if largest is None or value > largest[0]:
                largest = (value, f"{phase} of layer {index} ({kind})")
    return largest


_PEAK_PHASE = re.compile(r"(forward|backward) of layer (\d+) \(\w+\)")


def peak_moment(peak_phase: str) -> tuple[str, int] | None:
    """(``forward`` / ``backward``, layer index in the hot stage) of a row's ``peak_phase`` as
    ``rank_peak`` writes it; None for a row without one."""
    match = _PEAK_PHASE.fullmatch(peak_phase)
    return None if match is None else (match[1], int(match[2]))


def _add_peaks(
    rows: list[EstimateRow], result: dict[str, Any], stage: list[str], in_flight: int, target: int
) -> None:
    """Each measured row's activation peak on the rank and where it is; the peak saving vs []'s."""
    control_peak = None
    for row in rows:
        peak = rank_peak(result, row.label, stage, in_flight, target)
        if row.retained_bytes is None or peak is None:
            continue
        row.peak_bytes, row.peak_phase = round(peak[0]), peak[1]
        if row.status == CONTROL_STATUS:
            control_peak = row.peak_bytes
    for row in rows:
        if row.peak_bytes is not None and control_peak is not None:
            row.peak_saving_bytes = control_peak - row.peak_bytes


def _row(
    row: str,
    result: dict[str, Any],
    layers: dict[str, int],
    in_flight: int,
    target: int,
    control_total: Fraction,
    control_parts: dict[str, tuple[Fraction, dict[str, Fraction]]],
) -> EstimateRow:
    if row == CONTROL_ROW:
        attribution = {
            f"{kind}:{name}": round(value * n * in_flight)
            for kind, n in layers.items()
            for name, value in control_parts[kind][1].items()
        }
        return EstimateRow(
            row,
            CONTROL_STATUS,
            retained_bytes=round(control_total),
            saving_bytes=0,
            saving_pct=0.0,
            per_kind={
                kind: {
                    "layers": n,
                    MetricName.RETAINED_BYTES: round(control_parts[kind][0] * n * in_flight),
                    "saving_bytes": 0,
                }
                for kind, n in layers.items()
            },
            attribution=dict(sorted(attribution.items(), key=lambda item: (-item[1], item[0]))),
        )
    fields = RecomputeFields.parse(row)
    if fields.granularity == "full":
        return EstimateRow(
            row,
            UNMEASURED,
            "full recompute is applied by TransformerBlock across layers; the "
            "per-layer estimate measures selective recompute only",
        )
    if row in result["rejected"]:
        rejected = result["rejected"][row]
        return EstimateRow(row, REJECTED, rejected["message"], rejected["rule"])
    if row in result["requires_te"] and any(row not in result["kinds"][kind] for kind in layers):
        return EstimateRow(row, REQUIRES_TE, result["requires_te"][row]["reason"])
    per_kind: dict[str, dict[str, int]] = {}
    total = Fraction(0)
    removed: dict[str, Fraction] = defaultdict(Fraction)
    for kind, count in layers.items():
        bytes_, modules = _at_target(result["kinds"][kind][row], target)
        control_bytes, control_modules = control_parts[kind]
        scale = count * in_flight
        per_kind[kind] = {
            "layers": count,
            MetricName.RETAINED_BYTES: round(bytes_ * scale),
            "saving_bytes": round((control_bytes - bytes_) * scale),
        }
        total += bytes_ * scale
        for name in set(modules) | set(control_modules):
            delta = (
                control_modules.get(name, Fraction(0)) - modules.get(name, Fraction(0))
            ) * scale
            if delta:
                removed[f"{kind}:{name}"] += delta
    saving = control_total - total
    removed_list = [
        {"module": name, "bytes": round(value)}
        for name, value in sorted(removed.items(), key=lambda item: (-item[1], item[0]))
    ]
    pct = float(saving / control_total * 100) if control_total else None
    if row in result["requires_te"]:
        te = result["requires_te"][row]
        return EstimateRow(
            row,
            REQUIRES_TE,
            te["reason"],
            partial_saving_bytes=round(saving),
            per_kind=per_kind,
            removed=removed_list,
        )
    inactive_kinds = [
        kind
        for kind, part in per_kind.items()
        if part["saving_bytes"] == 0 and not any(name.startswith(f"{kind}:") for name in removed)
    ]
    if len(inactive_kinds) == len(layers):
        return EstimateRow(
            row,
            INACTIVE,
            "accepted, but no layer kind retains other bytes than under []",
            retained_bytes=round(total),
            saving_bytes=0,
            saving_pct=0.0,
            per_kind=per_kind,
        )
    reason = f"no effect on {', '.join(inactive_kinds)} layers" if inactive_kinds else ""
    return EstimateRow(
        row,
        EFFECTIVE,
        reason,
        retained_bytes=round(total),
        saving_bytes=round(saving),
        saving_pct=pct,
        per_kind=per_kind,
        removed=removed_list,
    )


def estimate(
    recipe: Recipe, rows: list[str] | None = None, attention_backend: str | None = None
) -> Estimate:
    """Measure and assemble the estimate of ``recipe`` (its own rows unless ``rows`` is given)."""
    check_estimable(recipe)
    backend = attention_backend_for(recipe, attention_backend)
    chosen = list(rows if rows is not None else recipe.rows)
    if CONTROL_ROW not in chosen:
        chosen.insert(0, CONTROL_ROW)
    for row in chosen:
        RecomputeFields.parse(row)
    target = EstimateTarget.of_recipe(recipe)
    results = measure_recipe(target, chosen, backend)
    result = assemble(target, chosen, backend, results)
    revisions = collect_revisions()
    result.revisions = {
        key: revisions[key] for key in ("torch", "megatron_core", "transformer_engine")
    }
    command = [
        "recompute-harness",
        "estimate",
        "--recipe",
        recipe.name,
        *(["--rows", *rows] if rows else []),
        *(["--attention-backend", attention_backend] if attention_backend else []),
    ]
    result.provenance = {
        "source": "cpu estimate run",
        "command": shlex.join(command),
        "host": socket.gethostname(),
        "date": now_iso(),
    }
    return result
