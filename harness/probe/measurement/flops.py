"""Backward FLOPs: torch's ``FlopCounterMode``, its per-operator dispatch made cheaper where torch's
code is the reviewed one.

``FlopCounterMode`` dispatches every operator of a backward through ``_FlopCounterMode``, which
rebuilds a set of fifteen metadata operators on every call, and, for every operator (its registry is
keyed by operator packets, the dispatched operator is an overload, so the test never finds one),
enters the mode again to try ``OpOverload.decompose``. ``decompose`` returns ``NotImplemented`` unless
the operator has a ``CompositeImplicitAutograd`` kernel (a Python one or a C++ one), and almost none
that reach a dispatch mode have one. Measured on the ``core_attn`` and ``full-uniform-1`` rows of
dense-tiny, moonlight-tiny and nemotron-h-tiny (CPU seconds, best of 3, summed): their backward took
0.09 s bare, 0.42 s under upstream's counter and the replay counter, 0.28 s under this counter and the
replay counter, 0.21 s under the module tracker and the replay counter alone.

``flop_counter()`` is the counter every measurement uses: on the reviewed torch, one whose dispatch
builds the skip set once and enters the mode to decompose only an operator that ``decompose`` would
decompose (asked once per operator and backward, the same two questions ``decompose`` asks); every
other step is upstream's, in upstream's order, so it returns and counts exactly what upstream does.
Its module tracker stays: its backward hooks add ``aten.view`` operators inside replayed modules, which
the goldens' replay figures include (docs/history.md). Any other torch gets ``FlopCounterMode`` as it
is: slower, never different.

``counting_flops_and(observer)`` is how a backward is counted: the FLOP counter and an operator
counter (the replay counter, ``harness.probe.measurement.measure.ReplayCounter``) entered above it. On the
reviewed torch the two share the counter's one dispatch, the observer's ``count`` called there with
the arguments and result it would have seen as the mode above (the operator as it arrives, before
any decomposition); a Python dispatch per operator less, a sixth of a counted backward. Elsewhere
both are entered as modes, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from typing import Any, Protocol

import torch
import torch.utils.flop_counter as upstream
from torch._C import DispatchKey
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from harness.cpu.adapter import source_digest

# The upstream code the cheaper dispatch restates, as reviewed (sha256[:16] of its source, torch 2.14.1).
_REVIEWED_FLOP_COUNTER = {
    "_FlopCounterMode.__torch_dispatch__": "0a179e9bbe15b91b",
    "FlopCounterMode.__enter__": "e1dbb6ab975313da",
    "OpOverload.decompose": "bf6c1b53f78d905e",
}
# A torch whose FlopCounterMode is its own dispatch mode has no _FlopCounterMode: it is used as it is.
_UpstreamDispatch: type = getattr(upstream, "_FlopCounterMode", object)


@cache
def _declined() -> frozenset[Any]:
    """The metadata queries upstream's dispatch declines (returns NotImplemented for), built once, and
    only on the reviewed torch (another may not have every one of them)."""
    aten, prim = torch.ops.aten, torch.ops.prim
    return frozenset(
        {
            aten.sym_is_contiguous.default,
            aten.is_contiguous.default,
            aten.is_contiguous.memory_format,
            aten.is_strides_like_format.default,
            aten.is_non_overlapping_and_dense.default,
            aten.size.default,
            aten.sym_size.default,
            aten.stride.default,
            aten.sym_stride.default,
            aten.storage_offset.default,
            aten.sym_storage_offset.default,
            aten.numel.default,
            aten.sym_numel.default,
            aten.dim.default,
            prim.layout.default,
        }
    )


_COMPOSITE = DispatchKey.CompositeImplicitAutograd


class OperatorCounter(Protocol):
    """A dispatch mode that counts operators by ``count(args, kwargs, out)`` (the replay counter)."""

    def count(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None: ...


class _DecomposingOnlyCompositesMode(_UpstreamDispatch):
    """``_FlopCounterMode`` that enters itself to decompose only an operator ``decompose`` would
    decompose; what it returns and counts is upstream's (see the module's docstring). With an
    ``observer``, each operator that reaches it from above (not one its decomposition issues) is
    also handed to ``observer.count``."""

    def __init__(self, counter: FlopCounterMode, observer: OperatorCounter | None = None) -> None:
        super().__init__(counter)
        self._declined = _declined()
        self._composite: dict[Any, bool] = {}
        self._observer = observer
        self._decomposing = 0  # operators issued by a decomposition in progress: not the observer's

    def _decomposes(self, func: Any) -> bool:
        known = self._composite.get(func)
        if known is None:
            known = _COMPOSITE in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), _COMPOSITE
            )
            self._composite[func] = known
        return known

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs if kwargs else {}
        if func in self._declined:
            return NotImplemented
        if isinstance(func, torch._ops.HigherOrderOperator):
            return self._handle_higher_order_ops(func, types, args, kwargs)
        if (
            func not in self.counter.flop_registry
            and func is not torch.ops.prim.device.default
            and self._decomposes(func)
        ):
            self._decomposing += 1
            try:
                with self:
                    decomposed = func.decompose(*args, **kwargs)
            finally:
                self._decomposing -= 1
            if decomposed is not NotImplemented:
                return self._observed(args, kwargs, decomposed)
        out = func(*args, **kwargs)
        return self._observed(
            args, kwargs, self.counter._count_flops(func._overloadpacket, out, args, kwargs)
        )

    def _observed(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        if self._observer is not None and not self._decomposing:
            self._observer.count(args, kwargs, out)
        return out


class _CheapFlopCounterMode(FlopCounterMode):
    observer: OperatorCounter | None = None  # handed every operator by the dispatch (see above)

    def __enter__(self):
        # Upstream's __enter__ with the cheaper dispatch mode.
        self.flop_counts.clear()
        self.mod_tracker.__enter__()
        self.mode = _DecomposingOnlyCompositesMode(self, self.observer)
        self.mode.__enter__()
        return self


def _upstream(name: str) -> Any:
    owner, _, attribute = name.partition(".")
    holder = torch._ops if owner == "OpOverload" else upstream
    return getattr(getattr(holder, owner, None), attribute, None)


@cache
def _flop_counter_is_reviewed() -> bool:
    return all(
        (code := _upstream(name)) is not None and source_digest(code) == digest
        for name, digest in _REVIEWED_FLOP_COUNTER.items()
    )


def flop_counter() -> FlopCounterMode:
    """A fresh FLOP counter (no table printed): the cheaper one where torch's code is the reviewed one."""
    return (
        _CheapFlopCounterMode(display=False)
        if _flop_counter_is_reviewed()
        else FlopCounterMode(display=False)
    )


@contextlib.contextmanager
def counting_flops_and(observer: TorchDispatchMode) -> Iterator[FlopCounterMode]:
    """A fresh FLOP counter with ``observer`` (a dispatch mode with ``count``, such as the replay
    counter) above it, for what runs inside: one shared dispatch on the reviewed torch, two modes
    elsewhere; the same counts either way (see the module's docstring)."""
    counter = flop_counter()
    if isinstance(counter, _CheapFlopCounterMode):
        counter.observer = observer
        with counter:
            yield counter
    else:
        with counter, observer:
            yield counter
