"""Collectives on staging copies, so gloo's late release of their tensors reaches no measurement.

A gloo collective's ``wait()`` returns when the operation completes; gloo's worker thread drops its
reference to the work object, which holds the collective's input and output tensors, a moment later
(docs/history.md). When Megatron Core's own reference goes first (a sequence-parallel all-gather's
``[s, b, h]`` output, a reduce-scatter's input), the tensor is freed on that thread, at a moment that
depends on scheduling: torch's ``MemTracker`` then counts it inside a phase's or a module's peak on
one run and not on the next, and one TP rank and not the other.

``staged_collectives()`` is a dispatch mode that hands every ``c10d`` operator (the dispatcher op
behind each ``torch.distributed`` collective) copies of its tensors, made and copied back with
Python dispatch off: no measuring mode sees the copies, and a late release frees only them. The
operator runs as issued, on the same process group, and is waited for before its outputs are copied
back (an ``async_op`` collective is complete when it returns, and every rank issues the same
collectives in the same order). The caller gets its own tensors and an already-completed work, not
gloo's: a second ``wait()`` on gloo's work re-runs its post-processing (a split and a copy into the
copies) with dispatch on, which would show the copies to every measuring mode. Entered *outside*
every measuring mode: they see each collective with Megatron Core's own tensors, as without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._C._distributed_c10d import _create_work_from_future
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_map_only

# c10d operators write into their arguments named so (``allreduce_``'s and ``broadcast_``'s
# ``tensors``, ``_allgather_base_``'s ``output_tensor``, ``alltoall_base_``'s ``output``, ...);
# their schemas carry no alias annotations to say it.
_WRITTEN = ("tensors", "output")


class _StagedCollectives(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "c10d":
            return func(*args, **kwargs)
        names = [argument.name for argument in func._schema.arguments]
        originals: dict[
            int, torch.Tensor
        ] = {}  # a staging copy's storage -> the tensor it stands for

        def stage(tensor: torch.Tensor) -> torch.Tensor:
            copy = tensor.clone()
            originals[_storage(copy)] = tensor
            return copy

        with torch._C._DisableTorchDispatch():
            staged_args, staged_kwargs = tree_map_only(torch.Tensor, stage, (args, kwargs))
            out = func(*staged_args, **staged_kwargs)
            for leaf in tree_flatten(out)[0]:
                if isinstance(leaf, torch.ScriptObject):
                    leaf.wait()
            written = [
                value
                for name, value in (*zip(names, staged_args, strict=False), *staged_kwargs.items())
                if name.startswith(_WRITTEN)
            ]
            for copy in tree_flatten(written)[0]:
                if isinstance(copy, torch.Tensor):
                    # Through ``.data``: the collective itself does not bump the tensor's version
                    # counter, so neither does its copy back.
                    originals[_storage(copy)].data.copy_(copy)
        done = _completed_work()

        def caller_side(leaf: Any) -> Any:
            # The operator returns its outputs as new tensor objects over the copies' storages:
            # the caller (and every mode above) gets the tensors it passed in. Its work is gloo's
            # no more: gloo's ``wait()`` runs its post-processing (a split and a copy into the
            # copies) again with dispatch on, which would show the copies to every mode.
            if isinstance(leaf, torch.Tensor):
                return originals.get(_storage(leaf), leaf)
            return done if isinstance(leaf, torch.ScriptObject) else leaf

        return tree_map(caller_side, out)


def _completed_work() -> torch.ScriptObject:
    """A c10d ``Work`` that is already complete (its ``wait()`` returns at once), boxed as the
    dispatcher passes works."""
    future: torch.futures.Future[None] = torch.futures.Future()
    future.set_result(None)
    return _create_work_from_future(future).boxed()


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


@contextmanager
def staged_collectives() -> Iterator[None]:
    """Every collective inside runs on staging copies of its tensors (module docstring)."""
    with _StagedCollectives():
        yield
