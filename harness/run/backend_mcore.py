"""The ``mcore`` back end: a minimal Megatron Core training loop around a style model.

Real MCore parallel state and a real MCore ``GPTModel`` (``harness.models``) with the row's
recompute fields; mock batches; ``torch.optim.AdamW``; gradients all-reduced the way MCore's DDP
groups them (dense parameters over data parallel, expert parameters — ``param.allreduce is False`` —
over expert data parallel). On CUDA it runs MCore unmodified (NCCL); on CPU under the CPU adapter
(gloo). The loop covers data and expert parallelism only (recipes with TP/PP/CP > 1 use ``bridge``).

Per iteration: ``forward`` (per micro-batch, including the world all-reduce of the loss, queued on
the device), ``backward``, ``grad-sync``, then ``optimizer-init`` on iteration 1 (the optimizer is
built and its state allocated by its first step) or ``optimizer-step`` afterwards. The step reads
its losses on the host once, after the last backward: every rank checks the same reduced values
there, so a NaN or Inf stops all ranks at the same step (reported in ``forward``, where the loss was
made) instead of hanging one, and no micro-batch waits for the device.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

from harness.config.fields import RecomputeFields
from harness.models import TinyModel, build_model
from harness.run.instrument import Instrument, NonFiniteLoss
from harness.run.recipes import Parallelism, Recipe

SEED = 1234
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _init_parallel(layout: Parallelism, device: str, timeout_s: float) -> None:
    if device == "cpu":
        from harness.cpu.adapter import init_cpu_parallel_state

        init_cpu_parallel_state(
            tp=layout.tp, pp=layout.pp, ep=layout.ep, cp=layout.cp, seed=SEED, timeout_s=timeout_s
        )
        return
    from harness.cpu.adapter import bind_fp8_disabled_without_te

    # Without TE, MCore's output-discard checkpoints query TE's FP8 state even in BF16 (NameError).
    bind_fp8_disabled_without_te()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=timedelta(seconds=timeout_s))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.expert_tp,
        distributed_timeout_minutes=max(1, math.ceil(timeout_s / 60)),
    )
    torch.manual_seed(SEED)
    model_parallel_cuda_manual_seed(SEED)


def _grad_groups(module: torch.nn.Module) -> list[tuple[Any, list[torch.Tensor]]]:
    """(process group, gradients) as MCore's DDP reduces them: dense over DP, experts over expert DP."""
    dense = [
        p.grad for p in module.parameters() if p.grad is not None and getattr(p, "allreduce", True)
    ]
    expert = [
        p.grad
        for p in module.parameters()
        if p.grad is not None and not getattr(p, "allreduce", True)
    ]
    return [
        (parallel_state.get_data_parallel_group(with_context_parallel=True), dense),
        (parallel_state.get_expert_data_parallel_group(), expert),
    ]


def _all_reduce_mean(group: Any, grads: list[torch.Tensor]) -> None:
    size = dist.get_world_size(group)
    if size == 1 or not grads:
        return
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat /= size
    for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)


def _reduced_loss(local: torch.Tensor) -> torch.Tensor:
    """World sum of the micro-batch loss, left on the device (no host sync)."""
    reduced = local.detach().float().clone()
    dist.all_reduce(reduced)
    return reduced


def _step_loss(reduced: list[torch.Tensor], local: list[torch.Tensor], iteration: int) -> float:
    """World-mean loss of the step, read with one device-to-host copy; NaN/Inf anywhere raises
    NonFiniteLoss on every rank at once (the reduced values are the same on every rank)."""
    values = torch.stack(
        [torch.stack(reduced).sum(), torch.stack([t.detach().float() for t in local]).sum()]
    ).tolist()
    value = values[0] / len(reduced) / dist.get_world_size()
    if not math.isfinite(value):
        raise NonFiniteLoss(iteration, value, values[1])
    return value


@dataclass
class MCoreTraining:
    """A built model and its optimizer; ``step`` runs one training iteration, phase by phase."""

    model: TinyModel
    micro_batches: int
    lr: float
    rank: int
    optimizer: torch.optim.Optimizer | None = None

    def step(self, iteration: int, instrument: Instrument) -> float:
        """One iteration; returns the world-mean loss."""
        reduced, local = [], []
        for micro in range(self.micro_batches):
            with instrument.phase(iteration, "forward"):
                batch = self.model.batch(seed=SEED + iteration * 1000 + micro * 10 + self.rank)
                loss = instrument.loss(self.model.loss(batch), iteration)
                reduced.append(_reduced_loss(loss))
                local.append(loss)
            with instrument.phase(iteration, "backward"):
                (loss / self.micro_batches).backward()
        step_loss = _step_loss(reduced, local, iteration)
        with instrument.phase(iteration, "grad-sync"):
            for group, grads in _grad_groups(self.model.module):
                _all_reduce_mean(group, grads)
        if self.optimizer is None:
            with instrument.phase(iteration, "optimizer-init"):
                self.optimizer = torch.optim.AdamW(self.model.module.parameters(), lr=self.lr)
                self.optimizer.step()
        else:
            with instrument.phase(iteration, "optimizer-step"):
                self.optimizer.step()
        instrument.read_allocated("after_step")
        self.optimizer.zero_grad(set_to_none=True)
        instrument.read_allocated("after_zero_grad")
        return step_loss


def build(recipe: Recipe, row: str, instrument: Instrument) -> MCoreTraining:
    """Parallel state + the style model with the row's recompute fields (phase ``model-build``)."""
    with instrument.phase(0, "model-build"):
        # Collectives may wait as long as the row may run: a stall is the runner's call, not gloo's.
        _init_parallel(recipe.parallelism, recipe.device, recipe.timeout_s)
        instrument.device_ready()
        model = _model(recipe, row)
    return _training(recipe, model, instrument)


def training_for(recipe: Recipe, row: str, instrument: Instrument) -> MCoreTraining:
    """``row``'s model and optimizer on the parallel state ``build`` set up: a second model in the
    same process (benchmarks/interleaved_noise.py alternates blocks of two rows' iterations)."""
    return _training(recipe, _model(recipe, row), instrument)


def _model(recipe: Recipe, row: str) -> TinyModel:
    model = build_model(
        recipe.model,
        RecomputeFields.parse(row),
        seq_length=recipe.seq_length,
        micro_batch_size=recipe.micro_batch_size,
        dtype=_DTYPES[recipe.precision],
        device=recipe.device,
        seed=SEED,
        expert_model_parallel_size=recipe.parallelism.ep,
        **recipe.backend_options.get("config", {}),
    )
    model.module.train()
    return model


def _training(recipe: Recipe, model: TinyModel, instrument: Instrument) -> MCoreTraining:
    # As run (the record's workload identity): the style models use MCore's local attention spec.
    instrument.note("attention_backend", "local")
    if model.config.num_moe_experts:
        instrument.note("moe_dispatcher", model.config.moe_token_dispatcher_type)
    micro_batches = recipe.global_batch_size // (
        recipe.micro_batch_size * recipe.parallelism.data_parallel(recipe.world_size)
    )
    return MCoreTraining(
        model, micro_batches, float(recipe.backend_options.get("lr", 1e-4)), dist.get_rank()
    )


def instrumented_iteration(training: MCoreTraining, iteration: int, instrument: Instrument) -> None:
    """A step plus what the harness measures around it: step time (device synced) and peaks."""
    started = time.perf_counter()
    loss = training.step(iteration, instrument)
    if training.model.device.type == "cuda":
        torch.cuda.synchronize()
    instrument.iteration_end(
        iteration, loss=loss, step_time_ms=(time.perf_counter() - started) * 1000.0
    )


def train(recipe: Recipe, row: str, instrument: Instrument) -> None:
    training = build(recipe, row, instrument)
    for iteration in range(1, recipe.train_iters + 1):
        instrumented_iteration(training, iteration, instrument)
    dist.barrier()
    dist.destroy_process_group()
