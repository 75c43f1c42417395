"""Memory carried across a training step: tensors a step leaves alive for the next one, and who holds them.

A recompute path can keep activations alive after backward until the next iteration overwrites
them (Megatron-LM issue #3221). Measured on the probe's second step, so what the first step builds
once and reuses (rotary caches, the MoE metrics tracker) is not counted:

1. after step 1, ``gc.collect()`` frees its garbage and ``gc.freeze()`` moves every Python object
   alive then into the permanent generation. Automatic collection is off for the whole measurement
   (``harness.probe.measurement.measure.no_automatic_gc``): when a collection runs depends on allocations in
   every thread, so a cycle-held cache could be freed before step 2 and rebuilt by it, or not;
2. step 2 runs (forward + backward, no instrumentation);
3. after ``gc.collect()`` the Python tensors ``gc.get_objects()`` still lists are exactly those made
   in step 2 and still alive. Their storages, deduplicated, minus parameters, gradients and the batch
   (and minus views of older storages), are the carried bytes; a tensor no walk reaches (below) is
   counted only if it outlives a bounded wait for C++ holders that are letting go (``_settled``:
   a finished gloo collective's work, the 256-byte flake of docs/history.md).

Freezing keeps the scan proportional to what step 2 made, not to the ~450k objects torch + Megatron
Core keep alive. Inside ``frozen_across_rows()`` (a probe pass) what a measurement froze stays frozen
until the pass ends, so the collection before the next row's step is proportional too: a full
collection of that heap cost 0.25 s, twice per row, about a third of a probe's time. A tensor held
from C++ keeps its Python object (torch preserves it), so it is listed too.

**Holders**: every carried storage is charged to the first path that reaches it, walked from Megatron
Core's module globals and then from the model (module attributes, into plain objects such as the MoE
token dispatcher, into containers). A reached tensor with a ``grad_fn`` also reaches, through its
autograd graph, the leaf tensors (and their ``.grad``) its ``AccumulateGrad`` nodes hold (a leaf made
by a checkpoint's replay is held that way) and what custom-Function nodes keep as Python attributes
(``ctx.rng_states``). What neither walk reaches is classified by its young referrers
(``gc.get_referrers``, cheap while frozen): a closure cell, a reference cycle, or unknown (C++).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import time
import types
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

try:
    from triton.runtime.jit import KernelInterface  # type: ignore[import-untyped]  # kernels, autotuners
except ImportError:  # no Triton: no Triton kernels to skip
    KernelInterface = None

_frozen_across_rows = (
    False  # inside frozen_across_rows(): measure_carried leaves its freeze in place
)
# How long a tensor that no walk reaches may take to be released by a C++ holder that is letting go
# (``_settled``), and how often it is looked at meanwhile.
_SETTLE_S, _SETTLE_POLL_S = 2.0, 0.002
_MAX_DEPTH = 4  # attribute / container nesting followed from a root; Megatron's holders sit at 1-3
_GLOBAL_PREFIX = "megatron."
# Values that hold nothing: never queued by a walk.
_SCALARS = (str, bytes, int, float, bool, type(None))
# Objects whose attributes are code or configuration, not state a step writes. Loggers reach every
# logger of the process (their manager), and Triton kernels their source and compiled cache: most of
# what a walk from Megatron Core's globals visited, and never a tensor.
_OPAQUE = (
    logging.Logger,
    logging.Manager,
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    torch.nn.Parameter,
    torch.dtype,
    torch.device,
    *((KernelInterface,) if KernelInterface is not None else ()),
    *_SCALARS,
)


@dataclass(frozen=True)
class CarriedTensor:
    holder: str  # e.g. "decoder.layers.1.mlp.token_dispatcher.local_probs -> graph leaf .grad"
    module: str  # the model module the holder belongs to ("<global>", "<closure>", ...)
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class Carried:
    tensors: list[CarriedTensor] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors)

    def attribution(self) -> dict[str, int]:
        """Carried bytes per holding module, in the style of retained-bytes attribution."""
        out: dict[str, int] = defaultdict(int)
        for tensor in self.tensors:
            out[tensor.module] += tensor.nbytes
        return dict(out)


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _children(obj: object) -> Iterator[tuple[str, object]]:
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            yield f"[{key!r}]", value
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield f"[{index}]", value
    elif not isinstance(obj, _OPAQUE) and not isinstance(obj, torch.Tensor):
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            for key, value in list(attributes.items()):
                if not isinstance(value, torch.nn.Module):  # modules are walked by their own path
                    yield f".{key}", value


class _Reach:
    """Breadth-first walk from named roots, recording the first path to each carried storage."""

    def __init__(self, wanted: dict[int, torch.Tensor]) -> None:
        self.wanted = wanted
        self.found: dict[int, tuple[str, str]] = {}  # storage key -> (holder path, module)
        self._visited: set[int] = set()
        # Graph nodes' Python wrappers are made on access; holding them keeps their id()s unique.
        self._nodes: list[object] = []

    def walk(self, root: object, path: str, module: str) -> None:
        level = [(path, root)]
        for depth in range(_MAX_DEPTH + 1):
            following = []
            for where, obj in level:
                if id(obj) in self._visited or len(self.found) == len(self.wanted):
                    continue
                self._visited.add(id(obj))
                if isinstance(obj, torch.Tensor):
                    self._tensor(obj, where, module)
                elif depth < _MAX_DEPTH:
                    following += [
                        (where + name, child)
                        for name, child in _children(obj)
                        if not isinstance(child, _SCALARS)
                    ]
            if not following:
                break
            level = following

    def _tensor(self, tensor: torch.Tensor, where: str, module: str) -> None:
        self._charge(tensor, where, module)
        if (
            tensor.is_leaf and tensor.grad is not None
        ):  # a non-leaf's .grad is never populated (and warns)
            self._charge(tensor.grad, where + ".grad", module)
        if tensor.grad_fn is not None:
            self._graph(tensor.grad_fn, where, module)

    def _graph(self, root: object, where: str, module: str) -> None:
        """What the autograd graph behind a held tensor keeps: the leaves (and their ``.grad``) its
        ``AccumulateGrad`` nodes hold, and the Python attributes of custom-Function nodes (``ctx.x``),
        which backward does not free the way it frees saved tensors."""
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or id(node) in self._visited:
                continue
            self._visited.add(id(node))
            self._nodes.append(node)
            variable = getattr(node, "variable", None)  # AccumulateGrad
            if isinstance(variable, torch.Tensor):
                self._charge(variable, where + " -> graph leaf", module)
                if variable.grad is not None:
                    self._charge(variable.grad, where + " -> graph leaf .grad", module)
            attributes = getattr(node, "__dict__", None)
            if attributes:
                self.walk(attributes, f"{where} -> graph {type(node).__name__}", module)
            stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))

    def _charge(self, tensor: torch.Tensor, where: str, module: str) -> None:
        key = _key(tensor)
        if key in self.wanted and key not in self.found:
            self.found[key] = (where, module)


def _global_roots() -> list[tuple[str, object]]:
    """Megatron Core's module globals that can hold a tensor (code is skipped), and tensors that are
    class attributes (``MoEAuxLossAutoScaler.main_loss_backward_scale``)."""
    roots: list[tuple[str, object]] = []
    for module_name, imported in list(sys.modules.items()):
        if not module_name.startswith(_GLOBAL_PREFIX) or imported is None:
            continue
        for attribute, value in list(vars(imported).items()):
            if attribute.startswith("__builtins"):  # builtins' namespace (TorchDynamo copies it)
                continue
            if isinstance(value, type):
                if value.__module__ == module_name:
                    roots += [
                        (f"{module_name}.{attribute}.{name}", item)
                        for name, item in list(vars(value).items())
                        if isinstance(item, torch.Tensor)
                    ]
            elif not isinstance(value, _OPAQUE):
                roots.append((f"{module_name}.{attribute}", value))
    return roots


def _young_tensors() -> list[torch.Tensor]:
    return [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]


def _new_storages(young: list[torch.Tensor], excluded: set[int]) -> dict[int, torch.Tensor]:
    """Storage key -> one young tensor on it, for the storages not in ``excluded`` (and not empty)."""
    young_ids = {id(t) for t in young}
    wanted: dict[int, torch.Tensor] = {}
    for tensor in young:
        # A view of an older tensor's storage (a cache sliced this step) is not new memory.
        if tensor._base is not None and id(tensor._base) not in young_ids:
            continue
        key = _key(tensor)
        if key not in excluded and tensor.untyped_storage().nbytes() > 0:
            wanted.setdefault(key, tensor)
    return wanted


def _settled(unreached: list[weakref.ReferenceType[torch.Tensor]]) -> list[torch.Tensor]:
    """The tensors of ``unreached`` still alive once transient C++ holders have let go.

    A finished collective is one: ``wait()`` returns when the operation completes, and gloo's worker
    thread drops the work (which holds its input and output tensors) just after, so a step's last
    all-reduce (vocab-parallel cross-entropy's ``[s, b]`` logits, even on a TP group of one) or
    sequence-parallel all-gather (``[s, b, h]``) is sometimes still alive when the step returns, and
    sometimes not: the 256-byte carried flake of docs/history.md. Their deaths are waited for,
    boundedly (a loaded machine may not run that thread for a while); what outlives the wait is
    carried. Nothing is waited for when every carried tensor has a Python holder (the usual case)."""
    deadline = time.monotonic() + _SETTLE_S
    alive = [ref for ref in unreached if ref() is not None]
    while alive and time.monotonic() < deadline:
        time.sleep(_SETTLE_POLL_S)
        alive = [ref for ref in alive if ref() is not None]
    return [tensor for ref in alive if (tensor := ref()) is not None]


def _carried(tensor: torch.Tensor, holder: str, owner: str) -> CarriedTensor:
    return CarriedTensor(
        holder,
        owner,
        tuple(tensor.shape),
        str(tensor.dtype).removeprefix("torch."),
        tensor.untyped_storage().nbytes(),
    )


def _unreached_holder(tensor: torch.Tensor) -> tuple[str, str]:
    """What holds a tensor no walk reached, judged by its young referrers."""
    referrers = [ref for ref in gc.get_referrers(tensor) if not isinstance(ref, types.FrameType)]
    if any(isinstance(ref, types.CellType) for ref in referrers):
        return "a closure cell", "<closure>"
    if referrers:
        kinds = sorted({type(ref).__name__ for ref in referrers})
        return f"a reference cycle or container ({', '.join(kinds)})", "<cycle>"
    return "no Python referrer (held from C++)", "<unknown>"


@contextlib.contextmanager
def frozen_across_rows() -> Iterator[None]:
    """Measurements inside keep every object they froze frozen until the end, then it is unfrozen and
    collected once. What is frozen while alive and dies in a reference cycle waits for that end; what
    dies by reference count (almost everything) is freed at once, frozen or not."""
    global _frozen_across_rows
    if _frozen_across_rows:  # nested: the outer scope unfreezes
        yield
        return
    _frozen_across_rows = True
    try:
        yield
    finally:
        _frozen_across_rows = False
        gc.unfreeze()
        gc.collect()


def measure_carried(
    module: torch.nn.Module, step: Callable[[], None], excluded: list[torch.Tensor]
) -> Carried:
    """Run ``step`` (the second one) with everything older frozen, and report what it left alive.

    ``excluded``: tensors whose storages are not carried memory by definition (the batch); parameters
    and their gradients are excluded here.
    """
    gc.collect()  # step 1's garbage, at a fixed point (automatic collection is off)
    gc.freeze()
    unfreeze = not _frozen_across_rows
    try:
        step()
        gc.collect()
        young = _young_tensors()
        old_excluded = {_key(p) for p in module.parameters()} | {_key(t) for t in excluded}
        old_excluded |= {_key(p.grad) for p in module.parameters() if p.grad is not None}
        wanted = _new_storages(young, old_excluded)
        reach = _Reach(wanted)
        # Globals first: a state the RNG tracker holds now is the tracker's, even when a checkpoint's
        # ctx holds the same storage too.
        for where, value in _global_roots():
            reach.walk(value, where, "<global>")
        for name, submodule in module.named_modules():
            for attribute, value in list(vars(submodule).items()):
                if attribute not in ("_parameters", "_modules") and not isinstance(
                    value, torch.nn.Module
                ):
                    reach.walk(
                        value, f"{name}.{attribute}" if name else attribute, name or "(model)"
                    )
        tensors = [
            _carried(tensor, *reach.found[key])
            for key, tensor in wanted.items()
            if key in reach.found
        ]
        unreached = [weakref.ref(t) for key, t in wanted.items() if key not in reach.found]
        del young, wanted, reach
        # Only weak references from here: a holder that is letting go must be able to.
        survivors = _settled(unreached)
        while survivors:  # popped, so no list of ours is among a survivor's referrers
            survivor = survivors.pop()
            tensors.append(_carried(survivor, *_unreached_holder(survivor)))
            del survivor
    finally:
        if unfreeze:
            gc.unfreeze()
    tensors.sort(key=lambda t: (t.holder, t.shape))
    return Carried(tensors)
