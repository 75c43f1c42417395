"""The probe on a pipeline: each stage of a ``pp``-stage model under Megatron Core's own 1F1B schedule.

``probe --model NAME --pipeline-parallel N`` starts ``N`` CPU ranks under torchrun (gloo,
``harness.probe.workers.rank_worker``). Each rank builds its stage as a training script's model provider
does (MCore's ``TransformerBlock`` builds only the stage's layers; ``pre_process`` / ``post_process``
from the parallel state) and runs one training step of ``PIPELINE_MICROBATCHES`` micro-batches through
``get_forward_backward_func()`` (``forward_backward_pipelining_without_interleaving``) for ``[]`` and
every full-recompute row. The ``recompute_num_layers`` values are derived from the *stage's* depth
(``harness.probe.sweep``): Megatron Core applies them per stage (``_checkpointed_forward`` walks
``num_layers_per_pipeline_rank``).

Per stage and row (``ProbeRowResult``, one ``ModelProbe`` per stage, one golden each):

- ``retained_bytes``: what autograd holds when the stage's forward of the first micro-batch returns
  (saved-tensor hooks around the model call in the forward-step function, as the single-stage probe
  measures a forward: ``harness.probe.measurement.measure``);
- ``inflight_bytes``: the most saved bytes alive at once across the micro-batches in flight
  (forwarded, and not yet reached by backward: none of their saved tensors unpacked), sampled as each
  micro-batch's forward returns (only backward frees them, so that is where the peak is). 1F1B runs
  ``N - stage - 1`` warm-up forwards before its first backward: stage 0 of two holds two micro-batches
  there, the last stage one;
- ``backward_flops``: FLOPs of the step minus those of its forward steps (``FlopCounterMode``);
  ``replay_bytes`` / ``replay_ops``: ops run with grad mode on inside the autograd engine (the
  schedule's own ops outside backward, its receive buffers among them, are not replays);
- equivalence against ``[]`` on the same stage: the stage's parameter gradients (and, on the last
  stage, the micro-batches' losses) bit for bit, with dropout off and on.

The schedule runs as Megatron-LM's training sets it: ``deallocate_pipeline_outputs`` on (a stage's
sent output is pseudo-freed), ``pipeline_dtype`` the parameters' dtype. Its p2p runs as separate
``isend`` / ``irecv`` (``batch_p2p_comm`` off, a config switch of MCore's): the batched path
synchronizes CUDA after every exchange. The schedule counts tokens in a tensor it allocates on
``"cuda"`` by name: the CPU adapter's part 8 (``cuda_allocations_on_cpu``) puts that allocation on the
CPU for the span of the call. A row the validator refuses is ``rejected`` on every stage alike (before
any communication); an exception inside the step fails the whole probe (the other stage would wait on
it), and a step past the timeout has its process tree killed and is reported as a hang.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from harness.config.fields import SKIP_FINAL_FIELD, RecomputeFields
from harness.config.validate import (
    MCORE_REJECTIONS,
    ConfigRejected,
    config_has_field,
)
from harness.cpu.adapter import cuda_allocations_on_cpu, init_cpu_parallel_state, reseed
from harness.errors import UsageError
from harness.models import StyleModel, TinyModel, build_model, buildable_model
from harness.probe.measurement.flops import counting_flops_and, flop_counter
from harness.probe.measurement.measure import (
    ReplayCounter,
    SavedTensors,
    excluded_storages,
    no_automatic_gc,
    saved_during,
)
from harness.probe.measurement.status import (
    CONTROL_STATUS,
    EFFECTIVE,
    INACTIVE,
    REJECTED,
    compare_numerics,
)
from harness.probe.plan import CONTROL
from harness.probe.runner import DTYPES, ModelProbe, ProbeRowResult, single_thread
from harness.probe.sweep import full_recompute_fields
from harness.probe.workers.ranks import RANKS_TIMEOUT_S, check_rank_count, run_probe_ranks

PIPELINE_MICROBATCHES = 4  # more than the stages: 1F1B reaches its steady state on every stage
# The schedule's settings (module docstring): Megatron-LM's training sets, with p2p unbatched for gloo.
SCHEDULE_CONFIG: dict[str, Any] = {"deallocate_pipeline_outputs": True, "batch_p2p_comm": False}


def check_pipelinable(style: StyleModel, pp: int) -> None:
    """Refuse, before any rank starts, a layout the pipeline probe cannot build (UsageError)."""
    where = f"--pipeline-parallel {pp} with {style.name}"
    check_rank_count("--pipeline-parallel", pp, "stage")
    if style.hybrid_pattern:
        raise UsageError(
            f"{where}: a hybrid model's stack is built whole here (harness/models/hybrid.py); the pipeline "
            "probe builds GPT models"
        )
    if style.config_kwargs.get("mtp_num_layers"):
        raise UsageError(
            f"{where}: its Multi-Token Prediction layer would sit on the last stage beside the "
            "output layer, which the pipeline probe does not build"
        )
    if pp > style.layers:
        raise UsageError(
            f"{where}: PP {pp} is larger than its {style.layers} layers (every stage needs one)"
        )
    if style.layers % pp:
        raise UsageError(f"{where}: its {style.layers} layers do not split evenly over {pp} stages")


def probe_pipeline(
    model: str,
    pp: int,
    *,
    precisions: Sequence[str] = ("fp32",),
    attention_backend: str = "unfused",
    timeout_s: float = RANKS_TIMEOUT_S,
) -> list[ModelProbe]:
    """One ``ModelProbe`` per stage, in stage order, per precision (in ``precisions``' order), from one
    job of ``pp`` torchrun ranks. A job that fails or hangs raises RuntimeError naming the cause
    (its last line, or the timeout)."""
    check_pipelinable(buildable_model(model), pp)
    per_precision = run_probe_ranks(
        model,
        "--pipeline-parallel",
        pp,
        precisions=precisions,
        attention_backend=attention_backend,
        what=f"the PP {pp} probe of {model} ({', '.join(precisions)}, {attention_backend})",
        timeout_s=timeout_s,
    )
    return [
        probe for stages in per_precision for probe in sorted(stages, key=lambda probe: probe.stage)
    ]


# --- on each rank (harness.probe.workers.rank_worker) -------------------------------------------------


@dataclass
class StageStep:
    """One training step of a stage through the 1F1B schedule."""

    losses: torch.Tensor  # the micro-batches' losses on the last stage; empty elsewhere
    grads: dict[str, torch.Tensor]
    retained_bytes: int = 0  # the first micro-batch's, when its forward returned
    inflight_bytes: int = 0
    backward_flops: int = 0
    replay_bytes: int = 0
    replay_ops: int = 0


class EngineReplayCounter(ReplayCounter):
    """Replayed ops in a whole pipeline step: grad mode on *inside the autograd engine* (a
    checkpoint's forward run again during backward). Forward steps and the schedule's own ops run
    with grad mode on outside it."""

    def replayed(self) -> bool:
        return torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1


def build_stage(
    model: str, fields: RecomputeFields, *, dropout: bool, dtype: torch.dtype, **sizes: Any
) -> TinyModel:
    """This rank's stage of ``model`` with ``fields`` (the validator's exception when it refuses)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_model(
            model,
            fields,
            dropout=dropout,
            dtype=dtype,
            pipeline_dtype=dtype,
            **SCHEDULE_CONFIG,
            **sizes,
        )
    # As the single-stage probe: training in bf16 casts every parameter (Float16Module).
    built.module.to(dtype)
    return built


def stage_step(built: TinyModel, *, seed: int, instrument: bool = True) -> StageStep:
    """One step of ``PIPELINE_MICROBATCHES`` micro-batches through MCore's pipeline schedule; with
    ``instrument`` False only losses and gradients."""
    module = built.module
    module.train()
    module.zero_grad(set_to_none=True)
    excluded = excluded_storages(module)
    in_flight: list[SavedTensors] = []
    retained: list[int] = []
    peak = 0
    forward_flops = 0

    def forward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # On a later stage GPTModel ignores the tokens: its input is what the schedule received.
        return module(
            batch["input_ids"],
            batch["position_ids"],
            batch["attention_mask"],
            labels=batch["labels"],
        )

    def loss_func(per_token: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = per_token.float().mean()
        return loss, {"stage loss": loss.detach().clone()}

    def forward_step(data_iterator: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        nonlocal peak, forward_flops
        batch = next(data_iterator)
        if not instrument:
            return forward(batch), loss_func
        with flop_counter() as flops:
            output, saved = saved_during(module, lambda: forward(batch))
        forward_flops += flops.get_total_flops()
        retained.append(saved.retained(excluded)[0])
        in_flight.append(saved)
        # In flight: the micro-batches backward has not reached yet. A finished one's received
        # input can outlive its backward for a moment in gloo's worker thread (the late release of
        # docs/history.md); it is not held for backward, and counting it would depend on timing.
        waiting = [record for record in in_flight if record.unpacked == 0]
        peak = max(peak, SavedTensors.live_bytes(waiting, excluded))
        return output, loss_func

    def step() -> list[Any]:
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            # Drawn as the schedule asks: a finished micro-batch's tokens are held by nothing.
            data_iterator=(built.batch(seed=i) for i in range(PIPELINE_MICROBATCHES)),
            model=module,
            num_microbatches=PIPELINE_MICROBATCHES,
            seq_length=built.seq_length,
            micro_batch_size=built.micro_batch_size,
        )

    reseed(seed)
    with no_automatic_gc(), cuda_allocations_on_cpu():
        if not instrument:
            stored = step()
        else:
            replay = EngineReplayCounter()
            with counting_flops_and(replay) as step_flops:
                stored = step()
    grads = {
        name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None
    }
    losses = torch.stack([entry["stage loss"] for entry in stored]) if stored else torch.empty(0)
    if not instrument:
        return StageStep(losses, grads)
    return StageStep(
        losses,
        grads,
        retained[0],
        peak,
        int(step_flops.get_total_flops() - forward_flops),
        replay.bytes,
        replay.ops,
    )


def measure_stage_row(
    model: str,
    fields: RecomputeFields,
    control: tuple[dict[str, Any], StageStep, StageStep] | None,
    *,
    seed: int,
    dtype: torch.dtype,
    **sizes: Any,
) -> tuple[ProbeRowResult, tuple[dict[str, Any], StageStep, StageStep]]:
    """One row on this stage: (its result, the (weights, step, dropout step) rows compare against:
    ``control`` when given, else this row's own, for the ``[]`` control itself).

    The validator's refusal is a ``rejected`` row: it runs on every rank alike, before any
    communication. An exception inside the step propagates: the other stages wait on this one, so
    the whole probe fails, naming it."""
    try:
        built = build_stage(model, fields, dropout=False, dtype=dtype, **sizes)
    except MCORE_REJECTIONS as exc:
        if control is None:
            raise
        rejected = ConfigRejected.from_exception(exc)
        message = rejected.message.strip().splitlines()[0] if rejected.message.strip() else ""
        row = ProbeRowResult(
            fields.name,
            REJECTED,
            message or rejected.mcore_exception,
            rejected.rule,
            fields=fields,
            add_bias_linear=False,
        )
        return row, control
    state = built.module.state_dict() if control is None else control[0]
    built.module.load_state_dict(state)
    measured = stage_step(built, seed=seed)
    with_dropout = build_stage(model, fields, dropout=True, dtype=dtype, **sizes)
    with_dropout.module.load_state_dict(state)
    dropout = stage_step(with_dropout, seed=seed, instrument=False)
    base = control or (state, measured, dropout)
    counts = (measured.retained_bytes, measured.backward_flops, measured.replay_bytes)
    control_counts = (base[1].retained_bytes, base[1].backward_flops, base[1].replay_bytes)
    if control is None:
        status, reason = CONTROL_STATUS, ""
    elif counts == control_counts:
        status = INACTIVE
        reason = "accepted, but retained bytes, backward FLOPs and replayed bytes equal []"
    else:
        status, reason = EFFECTIVE, ""
    row = ProbeRowResult(
        fields.name,
        status,
        reason,
        None,
        measured.retained_bytes,
        fields=fields,
        add_bias_linear=False,
        backward_flops=measured.backward_flops,
        replay_bytes=measured.replay_bytes,
        replay_ops=measured.replay_ops,
        equivalence=compare_numerics(
            measured.losses, measured.grads, base[1].losses, base[1].grads
        ),
        dropout_equivalence=compare_numerics(
            dropout.losses, dropout.grads, base[2].losses, base[2].grads
        ),
        inflight_bytes=measured.inflight_bytes,
    )
    return row, base


def stage_probe(
    model: str,
    pp: int,
    *,
    precision: str = "fp32",
    attention_backend: str = "unfused",
    seed: int = 1234,
    timeout_s: float = RANKS_TIMEOUT_S,
) -> ModelProbe:
    """This rank's stage of ``model`` on a ``pp``-stage pipeline (torchrun's environment): ``[]``
    and every full-recompute row for the stage's depth."""
    style = buildable_model(model)
    check_pipelinable(style, pp)
    init_cpu_parallel_state(pp=pp, seed=seed, timeout_s=timeout_s)
    dtype = DTYPES[precision]
    sizes = {"attention_backend": attention_backend}
    rows = full_recompute_fields(style.layers // pp, skip_final=config_has_field(SKIP_FINAL_FIELD))
    with single_thread():
        control_row, control = measure_stage_row(
            model, CONTROL, None, seed=seed, dtype=dtype, **sizes
        )
        results = [control_row]
        for fields in rows:
            results.append(
                measure_stage_row(model, fields, control, seed=seed, dtype=dtype, **sizes)[0]
            )
    return ModelProbe(
        style.name,
        style.description,
        style.seq_length,
        style.micro_batch_size,
        results,
        attention_backend,
        precision,
        pipeline_parallel=pp,
        stage=parallel_state.get_pipeline_model_parallel_rank(),
    )
