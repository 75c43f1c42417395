"""The mcore back end's timed step holds no avoidable host work (issue 14, finding 10): the causal mask
is built once on the model's device, and the step reads its losses on the host once, not per micro-batch.
Counted with torch's own dispatcher (a TorchDispatchMode sees every aten op the step runs)."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from harness.run.backend_mcore import build
from harness.run.instrument import Instrument
from harness.run.recipes import Recipe, load_recipe

HOST_READS = {
    "_local_scalar_dense",
    "_to_copy",
}  # .item(), and a copy off the device (.tolist() on GPU)


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._schema.name.split("::")[-1]] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    values = load_recipe("cpu-moonlight-ep2").as_dict()
    values.update(nnodes=1, nproc_per_node=1, parallelism={**values["parallelism"], "ep": 1})
    instrument = Instrument(tmp_path_factory.mktemp("events"), 0, "cpu")
    return build(Recipe.from_dict(values), "[]", instrument), instrument


def _count(function) -> Counter[str]:
    counter = OpCounter()
    with counter:
        function()
    return counter.ops


def test_the_causal_mask_is_built_once(training):
    model = training[0].model
    first = model.batch(seed=1)
    ops = _count(lambda: model.batch(seed=2))
    assert ops["triu"] == 0 and model.batch(seed=3)["attention_mask"] is first["attention_mask"]
    assert first["attention_mask"].shape == (1, 1, model.seq_length, model.seq_length)
    assert bool(first["attention_mask"][0, 0, 0, 1]) and not bool(
        first["attention_mask"][0, 0, 1, 0]
    )


def test_the_step_reads_its_loss_on_the_host_once(training):
    step, instrument = training
    assert step.micro_batches == 2
    step.step(1, instrument)  # builds the optimizer and its state
    model_only = _count(lambda: step.model.loss(step.model.batch(seed=5)).backward())
    optimizer_only = _count(
        step.optimizer.step
    )  # AdamW reads its step counters on the host: not ours
    step.optimizer.zero_grad(set_to_none=True)
    step_ops = _count(lambda: step.step(2, instrument))
    own_reads = sum(
        step_ops[op] - step.micro_batches * model_only[op] - optimizer_only[op] for op in HOST_READS
    )
    assert own_reads <= 1, {
        op: (step_ops[op], model_only[op], optimizer_only[op]) for op in HOST_READS
    }
