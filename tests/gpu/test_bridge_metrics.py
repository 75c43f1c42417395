"""GPU tier, Bridge half: the ``bridge`` back end's metrics callback, driven with Bridge's own state and
callback context the way Bridge's train loop drives it, on a real model list and a real optimizer.

``on_train_start`` reads ``context.model[0]``'s config and wraps ``context.optimizer.step``: the model is
a Megatron Core GPT model built through the harness's ``mcore`` back end's builder (on the CPU adapter
here, on the device's host memory on a GPU runner) in MCore's DDP wrapper as Bridge hands it over, the
optimizer the ``torch.optim.AdamW`` that back end trains with. A separate module from test_bridge_config.py: it starts a world of one (gloo) for the model
and ends it when done.
"""

from __future__ import annotations

import json

import pytest
import torch
from gates import require

from harness.config.fields import RecomputeFields
from harness.run.recipes import Recipe, load_recipe

pytestmark = pytest.mark.gpu


@pytest.fixture
def model_and_optimizer():
    require(gpus=0, te=True, bridge=True)
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    from harness.cpu.adapter import init_cpu_parallel_state
    from harness.models import build_model

    init_cpu_parallel_state()
    try:
        tiny = build_model("dense-tiny", RecomputeFields.selective())
        # As Bridge's setup gives train(): the model chunks wrapped in MCore's DDP, whose gradient
        # finalisation MCore's schedule calls through the config.
        chunk = DistributedDataParallel(
            config=tiny.config, ddp_config=DistributedDataParallelConfig(), module=tiny.module
        )
        tiny.config.finalize_model_grads_func = finalize_model_grads
        yield tiny, chunk, torch.optim.AdamW(tiny.module.parameters(), lr=1e-4)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _as_worker_sees_it(name: str) -> Recipe:
    return Recipe.from_dict(json.loads(json.dumps(load_recipe(name).as_dict())))


def test_rank_metrics_runs_its_four_events_on_a_real_model_and_optimizer(
    tmp_path, model_and_optimizer
):
    # Bridge's train loop (train.py): on_train_start; per step: CUDA-graph capture at the loop's top when
    # step - start == cuda_graph_warmup_steps, on_train_step_start, train_step (forward, backward,
    # finalize_model_grads, optimizer.step), on_train_step_end, step += 1, FLOPs added; on_train_end.
    from megatron.bridge.training.callbacks import CallbackContext
    from megatron.bridge.training.state import GlobalState

    from harness.run.backend_bridge import RankMetrics, configure
    from harness.run.events import events_path, read_rank
    from harness.run.instrument import Instrument

    tiny, chunk, optimizer = model_and_optimizer
    model = [chunk]
    cfg, _ = configure(_as_worker_sees_it("nemotron-3-nano-short-1gpu"), "[]")
    assert cfg.model.cuda_graph_impl == "transformer_engine"
    warmup = cfg.model.cuda_graph_warmup_steps
    state = GlobalState()
    state.cfg = cfg
    metrics = RankMetrics(Instrument(tmp_path, 0, "cpu"))

    def context(**extra):
        return CallbackContext(state=state, model=model, optimizer=optimizer, **extra)

    metrics.on_train_start(context())
    flops_per_step = 3.0e15
    lines = []
    for iteration in range(1, warmup + 3):
        metrics.on_train_step_start(context())
        loss = tiny.loss(tiny.batch(seed=iteration))
        loss.backward()
        tiny.config.finalize_model_grads_func(
            model
        )  # the wrapped function, as MCore's schedule calls it
        optimizer.step()  # the wrapped step: Bridge's train_step calls the optimizer's own
        chunk.zero_grad_buffer()
        optimizer.zero_grad()
        metrics.on_train_step_end(context(loss_dict={"lm loss": loss.detach()}, skipped_iter=False))
        lines.append(len(read_rank(events_path(tmp_path, 0), 0).iterations))
        state.train_state.step += 1
        state.train_state.floating_point_operations_so_far += flops_per_step
    metrics.on_train_end(context())

    assert lines == list(range(1, warmup + 3))  # every step is on disk when it ends
    evidence = read_rank(events_path(tmp_path, 0), 0)
    assert evidence.flops == {i: flops_per_step for i in range(1, warmup + 3)}
    assert all(row["step_time_ms"] > 0 and row["loss"] > 0 for row in evidence.iterations)
    assert evidence.notes["attention_backend"] == cfg.model.attention_backend.name
    phases = [
        (event["iteration"], event["phase"])
        for event in map(json.loads, events_path(tmp_path, 0).read_text().splitlines())
        if event["event"] == "phase"
    ]
    # The real optimizer's first step is its state's allocation, later ones steps; grad-sync before each.
    assert phases[:4] == [(1, "forward"), (1, "grad-sync"), (1, "optimizer-init"), (2, "forward")]
    assert (2, "optimizer-step") in phases and (2, "grad-sync") in phases
    capture = phases.index((warmup + 1, "cuda-graph-capture"))
    assert phases[capture - 1] == (warmup, "optimizer-step")
    assert phases[capture + 1] == (warmup + 1, "forward")
