"""One forward + backward of a tiny model, measured: loss, gradients, retained bytes, replay cost.

- **Retained bytes at the end of forward**: every tensor autograd saves during forward is packed
  through ``saved_tensors_hooks``; the hook keeps only a weak reference. When forward returns, the
  tensors still alive are exactly those autograd still holds, and their storages are measured *then*,
  so an output-discard checkpoint (``CheckpointWithoutOutput`` resizes the discarded output's storage
  to 0) counts as freed. Storages are deduplicated; parameter storages are excluded.
- **Attribution**: each saved storage is charged to the innermost module whose forward was running
  when autograd first saved it.
- **Carried bytes**: what a second, uninstrumented step leaves alive after its backward, and who
  holds it (harness.probe.measurement.carried).
- **Peaks over the step**: per phase (forward, backward, optimizer) and per module, from torch's
  ``MemTracker`` on a third step (harness.probe.measurement.peaks).
- **Replay cost**: backward FLOPs from ``FlopCounterMode`` (matmul-class ops only; ``harness.probe.measurement.flops``), plus the bytes
  read and written by every op *replayed* in backward. A replayed op is one that runs with grad mode
  on during backward: autograd runs backward with grad mode off, and every MCore checkpoint replays
  its forward under ``torch.enable_grad()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.cpu.adapter import reseed
from harness.models import TinyModel
from harness.probe.measurement.carried import Carried, measure_carried
from harness.probe.measurement.flops import counting_flops_and
from harness.probe.measurement.peaks import StepPeaks, measure_step_peaks


@dataclass
class Measurement:
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    retained_bytes: int
    attribution: dict[str, int]  # module path -> retained bytes first saved in its forward
    backward_flops: int
    replay_bytes: int
    replay_ops: int
    carried: Carried | None = None  # what a second step leaves alive (instrumented runs only)
    peaks: StepPeaks | None = (
        None  # a third step's per-phase / per-module peaks (instrumented only)
    )


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


class _ModuleStack:
    """The qualified names of the modules whose forward is running (innermost last)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.names: list[str] = []
        self._handles = []
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter(name)))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))

    def _enter(self, name: str):
        def hook(module, args):
            self.names.append(name)

        return hook

    def _leave(self, module, args, output):
        self.names.pop()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class SavedTensors:
    """``saved_tensors_hooks`` that record weak references to what autograd saves, and where."""

    def __init__(self, stack: _ModuleStack) -> None:
        self.stack = stack
        self.saved: list[tuple[weakref.ref, str]] = []
        self.unpacked = 0  # how many saved tensors backward has read back: 0 until it reaches them
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.saved.append(
            (weakref.ref(tensor), self.stack.names[-1] if self.stack.names else "<root>")
        )
        return tensor

    def _unpack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.unpacked += 1
        return tensor

    @staticmethod
    def live_bytes(records: list[SavedTensors], excluded: set[int]) -> int:
        """Bytes of the storages still alive across several records (micro-batches in flight),
        each storage once, ``excluded`` ones left out."""
        seen: set[int] = set(excluded)
        total = 0
        for record in records:
            for ref, _ in record.saved:
                tensor = ref()
                if tensor is None or _storage_key(tensor) in seen:
                    continue
                seen.add(_storage_key(tensor))
                total += tensor.untyped_storage().nbytes()
        return total

    def retained(self, parameter_storages: set[int]) -> tuple[int, dict[str, int]]:
        """Bytes of the live, non-parameter storages, deduplicated, and their attribution."""
        seen: set[int] = set()
        total = 0
        attribution: dict[str, int] = defaultdict(int)
        for ref, module in self.saved:
            tensor = ref()
            if tensor is None:
                continue
            key = _storage_key(tensor)
            if key in seen or key in parameter_storages:
                continue
            seen.add(key)
            nbytes = tensor.untyped_storage().nbytes()
            total += nbytes
            attribution[module] += nbytes
        return total, dict(attribution)


class ReplayCounter(TorchDispatchMode):
    """Bytes read + written by ops that run with grad mode on during backward: replayed forward ops.
    Entered around a backward call alone, so grad mode tells a replayed op (``replayed``)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.ops = 0

    def replayed(self) -> bool:
        return torch.is_grad_enabled()

    def count(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Count one operator (its arguments and result) if it is replayed."""
        if self.replayed():
            tensors = [
                t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)
            ]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            self.ops += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.count(args, kwargs, out)
        return out


@contextlib.contextmanager
def no_automatic_gc() -> Iterator[None]:
    """Python's cyclic collector off: it runs when allocations (in any thread) cross a threshold, so
    under load it freed cycle-held tensors at different points of a step from run to run, and the
    bytes a step retains or carries moved with it. Collections happen only where the probe asks."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def measure(
    model: TinyModel, *, seed: int = 1234, instrument: bool = True, later_steps: bool = True
) -> Measurement:
    """Run forward + backward once from a reset RNG; with ``instrument`` False only loss and grads;
    with ``later_steps`` False no second and third step (no carried bytes, no step peaks)."""
    with no_automatic_gc():
        return _measure(model, seed=seed, instrument=instrument, later_steps=later_steps)


def _measure(model: TinyModel, *, seed: int, instrument: bool, later_steps: bool) -> Measurement:
    module = model.module
    module.train()
    module.zero_grad(set_to_none=True)
    batch = model.batch()
    reseed(seed)
    if not instrument:
        loss = model.loss(batch)
        loss.backward()
        return Measurement(loss.detach(), _grads(module), 0, {}, 0, 0, 0)

    loss, retained_bytes, attribution = retained_by_forward(module, lambda: model.loss(batch))
    seed_grad = torch.ones_like(loss)  # made here, so the replay counter sees backward's ops only
    replay = ReplayCounter()
    with counting_flops_and(replay) as flops:
        loss.backward(seed_grad)
    first_step = Measurement(
        loss.detach(),
        _grads(module),
        retained_bytes,
        attribution,
        int(flops.get_total_flops()),
        replay.bytes,
        replay.ops,
    )
    if not later_steps:
        return first_step

    def second_step() -> None:
        module.zero_grad(set_to_none=True)
        reseed(seed)
        model.loss(batch).backward()

    carried = measure_carried(module, second_step, list(batch.values()))
    # After two steps, so what the first step builds once (rotary caches) is not in any phase's peak.
    peaks = measure_step_peaks(model, seed=seed)
    return dataclasses.replace(first_step, carried=carried, peaks=peaks)


def retained_by_forward(
    module: torch.nn.Module, forward: Callable[[], Any], shared: tuple[torch.Tensor, ...] = ()
) -> tuple[Any, int, dict[str, int]]:
    """Run ``forward()`` (a forward through ``module``) under the saved-tensor hooks: its output, the
    bytes autograd still holds when it returns (deduplicated storages; parameters and the ``shared``
    inputs' storages excluded) and their attribution by module. The output is returned so the caller
    keeps the graph (and so the saved tensors) alive for as long as it needs them."""
    output, saved = saved_during(module, forward)
    retained_bytes, attribution = saved.retained(excluded_storages(module, shared))
    return output, retained_bytes, attribution


def saved_during(module: torch.nn.Module, forward: Callable[[], Any]) -> tuple[Any, SavedTensors]:
    """Run ``forward()`` under the saved-tensor hooks: its output and the record of what autograd
    saved, which the caller measures when it chooses (a pipeline stage: with other micro-batches)."""
    stack = _ModuleStack(module)
    saved = SavedTensors(stack)
    try:
        with saved.hooks:
            output = forward()
    finally:
        stack.remove()
    return output, saved


def excluded_storages(module: torch.nn.Module, shared: tuple[torch.Tensor, ...] = ()) -> set[int]:
    """The storages no retained count includes: the parameters' and the ``shared`` inputs'."""
    return {_storage_key(t) for t in (*module.parameters(), *shared)}


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None
    }
