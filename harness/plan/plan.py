"""Every candidate row's predicted peak per rank, whether it fits the budget, its cost, and the
cheapest row that fits with a margin."""

from __future__ import annotations

import dataclasses
import shlex
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.fields import CONTROL_ROW, RecomputeFields
from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.golden.store import estimate_golden_path, existing, golden_root
from harness.plan.activations import (
    LABEL_SITES,
    LayerTable,
    RowActivations,
    row_activations,
    with_fp8_linear_inputs,
)
from harness.plan.flops import cost_share
from harness.plan.parameters import count_parameters, fake_parallel_state, full_config
from harness.plan.step import UNSEEN, moment_json, rank_peaks
from harness.plan.workload import TrainingJob

if TYPE_CHECKING:
    from harness.estimate.megatron_lm import MegatronLMRun
from harness.record.build import now_iso
from harness.record.io import read_json

DEFAULT_BUDGET_GB = 80.0
# The chosen row keeps this share of the budget free: what the model does not see (allocator
# fragmentation, NCCL, CUDA-graph pools: step.UNSEEN) has to fit there.
MARGIN = 0.05
# Each accepted label alone, the nested pairs the skill names (card.yaml, SKILL.md), whole-MoE with
# layernorm, and full recompute.
SINGLE_LABELS = (
    "core_attn",
    "mla_up_proj",
    "layernorm",
    "moe_act",
    "mlp",
    "moe",
    "shared_experts",
    "gdn_norm_out",
)
NESTED_PAIRS = (
    "mla_up_proj+core_attn",
    "mla_up_proj+mlp",
    "layernorm+moe_act",
    "moe+layernorm",
    "mlp+core_attn",
    "core_attn+layernorm",
)
FULL_ROWS = ("full-uniform-1", "full-uniform-2", "full-block-1")

FITS, OOM, REJECTED, UNMEASURED = "fits", "oom", "rejected", "unmeasured"
# The label of the row a Megatron-LM argument list asks for, as given.
GIVEN = "given"


@dataclass
class PlanRow:
    label: str
    status: str
    fits: bool | None
    peak_bytes: int | None
    cost_share: float | None
    source: str
    reason: str = ""
    rule: str | None = None
    oom: dict[str, Any] | None = None  # the first moment over the budget: rank, iteration, phase
    per_rank: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Plan:
    workload: str
    budget_bytes: int
    margin: float
    chosen: str | None
    rows: list[PlanRow]
    parallelism: dict[str, Any]
    training: dict[str, Any]
    unseen: dict[str, str]
    activations_source: dict[str, Any]
    ignored_flags: list[str] = field(default_factory=list)
    revisions: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidate_rows(workload_rows: tuple[str, ...]) -> list[str]:
    """``[]``, the given rows, each label alone, the skill's pairs and full recompute (no repeats)."""
    names: dict[str, None] = {}
    for row in (CONTROL_ROW, *workload_rows, *SINGLE_LABELS, *NESTED_PAIRS, *FULL_ROWS):
        names[RecomputeFields.parse(row).name] = None
    return list(names)


def estimate_golden(workload: TrainingJob, root: Path | str | None) -> tuple[dict[str, Any], str]:
    """The estimate measurements of the workload at the installed Megatron Core (and its path)."""
    path = estimate_golden_path(
        workload.name,
        workload.attention_backend,
        collect_revisions()["megatron_core"] or {},
        existing(golden_root(root)),
    )
    if not path.is_file():
        raise UsageError(
            f"no layer measurements for {workload.name!r} at this Megatron Core: {path} is missing "
            f"(recompute-harness estimate --recipe {workload.name} --write-golden writes it)"
        )
    return read_json(path), str(path)


def _rejections(workload: TrainingJob, rows: list[RecomputeFields]) -> dict[str, tuple[str, str]]:
    """The rows the real validator rejects on the full model's config: row -> (rule, message)."""
    from harness.config.validate import MCORE_REJECTIONS, ConfigRejected

    rejected = {}
    for fields in rows:
        try:
            full_config(workload, fields)
        except MCORE_REJECTIONS as exc:
            verdict = ConfigRejected.from_exception(exc)
            rejected[fields.name] = (verdict.rule, verdict.message.strip().splitlines()[0])
    return rejected


def resolved_row(workload: TrainingJob, fields: RecomputeFields) -> RecomputeFields:
    """``fields`` as the validator completes them (selective without modules: MCore's default
    modules); unchanged when the validator rejects them. The fake parallel state must be running."""
    from harness.config.validate import MCORE_REJECTIONS

    if fields.granularity != "selective" or fields.modules is not None:
        return fields
    try:
        config = full_config(workload, fields)
    except MCORE_REJECTIONS:
        return fields
    return RecomputeFields.selective(*config.recompute_modules)


def measurable_rows(workload: TrainingJob, rows: list[str]) -> list[str]:
    """The rows worth a layer measurement: ``[]`` and the selective rows whose labels have a
    checkpoint site in one of the model's layer kinds (full rows and the rest are derived)."""
    sites = set().union(*(LABEL_SITES.get(kind, frozenset()) for kind in workload.arch.kinds))
    chosen = [CONTROL_ROW]
    for row in rows:
        fields = RecomputeFields.parse(row)
        if fields.granularity == "selective" and set(fields.modules or ()) & sites:
            chosen.append(fields.name)
    return list(dict.fromkeys(chosen))


def measure_megatron_lm(
    run: MegatronLMRun, workload: TrainingJob, rows: list[str]
) -> tuple[dict[str, Any], str]:
    """The estimate's layer measurements of a Megatron-LM argument list, made now (no golden holds
    them): the real layers at their per-rank widths on this machine's CPU, as for a recipe."""
    from harness.estimate.estimate import EstimateTarget, assemble, measure_recipe

    if run.parallelism.tp > 8:
        raise UsageError(f"TP {run.parallelism.tp} would start that many CPU ranks; at most 8 run")
    # The estimate's layers are per layer and micro-batch whatever the stage; an uneven pipeline's
    # stages are not its even split, so its layers are measured as one stage (plan composes them).
    measured_layout = (
        run.parallelism
        if run.stage_layers is None
        else dataclasses.replace(run.parallelism, pp=1, vpp=None)
    )
    target = EstimateTarget(
        run.name,
        measured_layout,
        run.world_size,
        workload.local_seq_length,  # a CP rank's layers run s / CP tokens
        run.micro_batch_size,
        run.global_batch_size,
        run.precision,
        ("--megatron-lm", run.worker_json()),
    )
    names = measurable_rows(workload, rows)
    try:
        results = measure_recipe(target, names, workload.attention_backend)
        # the control unmeasurable (a layer the CPU cannot build) is the assembly's refusal
        estimate = assemble(target, names, workload.attention_backend, results)
    except RuntimeError as exc:
        raise UsageError(str(exc).strip().splitlines()[0]) from None
    return (
        estimate.as_dict(),
        f"measured now ({len(names)} rows at seq {estimate.probe_seq_lengths})",
    )


def plan(
    workload: TrainingJob,
    estimate: dict[str, Any],
    *,
    budget_bytes: int,
    rows: list[str],
    command: list[str],
    estimate_source: str,
    ignored_flags: list[str] | None = None,
    given: RecomputeFields | None = None,
) -> Plan:
    """Predict every row's per-rank peak and choose the cheapest that fits with ``MARGIN``; with
    ``given`` (a Megatron-LM argument list's row) a first row labelled ``given``."""
    counts = count_parameters(workload)
    labelled = [(row, RecomputeFields.parse(row)) for row in rows]
    with fake_parallel_state(workload):
        if given is not None:
            labelled.insert(0, (GIVEN, resolved_row(workload, given)))
        rejected = _rejections(workload, [fields for _, fields in labelled])
    table = LayerTable.from_estimate(estimate)
    # Rows the layer measurement found MCore cannot run (the worker's rejections: the validator
    # passes them): rejected as well, with the worker's rule and reason.
    for name, row in table.rows.items():
        if row.get("status") == REJECTED and row.get("rule"):
            rejected.setdefault(name, (row["rule"], row["reason"]))
    kinds = list(workload.arch.layer_kinds)
    out = [
        _row(workload, counts, table, kinds, label, fields, rejected, budget_bytes)
        for label, fields in labelled
    ]
    limit = budget_bytes * (1 - MARGIN)
    fitting = [r for r in out if r.peak_bytes is not None and r.peak_bytes <= limit]
    chosen = min(fitting, key=lambda r: (r.cost_share or 0.0, r.peak_bytes or 0), default=None)
    revisions = collect_revisions()
    layout = workload.parallelism
    return Plan(
        workload=workload.name,
        budget_bytes=budget_bytes,
        margin=MARGIN,
        chosen=None if chosen is None else chosen.label,
        rows=out,
        parallelism={
            "world_size": workload.world_size,
            "tp": layout.tp,
            "pp": layout.pp,
            "vpp": layout.vpp,
            "cp": layout.cp,
            "ep": layout.ep,
            "etp": layout.expert_tp,
            "dp": workload.data_parallel,
            "expert_dp": workload.expert_data_parallel,
            "sequence_parallel": workload.sequence_parallel,
            "micro_batches": workload.micro_batches,
        },
        training={
            "precision": workload.precision,
            "fp8": workload.fp8,
            "seq_length": workload.seq_length,
            "micro_batch_size": workload.micro_batch_size,
            "global_batch_size": workload.global_batch_size,
            "vocab_size": workload.vocab_size,
            "distributed_optimizer": workload.distributed_optimizer,
            "grad_reduce_in_fp32": workload.grad_reduce_in_fp32,
            "untie_embeddings": workload.untie_embeddings,
        },
        unseen=dict(UNSEEN),
        activations_source={"file": estimate_source, "provenance": table.provenance},
        ignored_flags=list(ignored_flags or []),
        revisions={key: revisions[key] for key in ("torch", "megatron_core")},
        provenance={
            "source": "cpu plan run",
            "command": shlex.join(command),
            "host": socket.gethostname(),
            "date": now_iso(),
        },
    )


def _row(
    workload: TrainingJob,
    counts: Any,
    table: LayerTable,
    kinds: list[str],
    label: str,
    fields: RecomputeFields,
    rejected: dict[str, tuple[str, str]],
    budget: int,
) -> PlanRow:
    activations: RowActivations = row_activations(
        fields.name, table, set(kinds), rejected, grouped_experts=workload.grouped_experts
    )
    if activations.source == "rejected":
        return PlanRow(
            label, REJECTED, None, None, None, "validator", activations.reason, activations.rule
        )
    if not activations.usable:
        return PlanRow(label, UNMEASURED, None, None, None, "none", activations.reason)
    if workload.fp8 is not None:
        activations = with_fp8_linear_inputs(activations, table)
    config = workload.arch.config
    share = cost_share(
        activations.replayed or fields.name,
        kinds,
        config,
        workload.seq_length,
        workload.micro_batch_size,
        workload.vocab_size,
        workload.parallelism.pp,
    )
    peaks = rank_peaks(workload, counts, activations, kinds)
    peak = max(peaks, key=lambda p: p.peak.total)
    first_over = next(
        ((p, m) for p in peaks for m in [p.first_over(budget)] if m is not None),
        None,
    )
    oom = (
        None
        if first_over is None
        else {
            "ranks": first_over[0].ranks,
            "stage": first_over[0].stage,
            **moment_json(first_over[1]),
            "total_bytes": first_over[1].total,
        }
    )
    return PlanRow(
        label,
        OOM if oom else FITS,
        oom is None,
        peak.peak.total,
        share,
        activations.source,
        activations.reason,
        oom=oom,
        per_rank=[
            {
                "ranks": p.ranks,
                "stage": p.stage,
                "peak_bytes": p.peak.total,
                **moment_json(p.peak),
            }
            for p in peaks
        ],
    )
