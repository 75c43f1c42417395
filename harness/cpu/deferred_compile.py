"""Part 4 of the CPU adapter: ``torch.compile`` decorations are deferred to the decorated function's first call.

Megatron Core decorates small fused helpers with ``jit_fuser``, which is ``torch.compile``, while its
modules import (``megatron.core`` itself imports ``fusions.fused_bias_geglu``). Decorating already
imports TorchDynamo and Inductor: about 3 s of CPU per process, in every rank of every CPU launch,
although ``torch.compile`` compiles nothing until a call. Deferred, a decoration returns a wrapper
that calls the real ``torch.compile`` with the same arguments on the first call and the compiled
function from then on: a helper that runs is compiled exactly as before; one that never runs on CPU
never pays for importing the compiler.

The decorations are made while ``megatron.core`` imports, so the deferral must be in place before
that: ``defer_compile_before_megatron_core()`` puts a finder first on ``sys.meta_path`` that wraps
``megatron.core``'s loader, so that the deferral is installed when the package executes, and then
steps aside. Installing the finder or looking MCore up imports nothing (``recompute-harness
revisions`` stays torch-free). The harness's entry points call it: the
CLI, the torchrun worker, the probe and estimate children, and this repo's pytest processes. Only on a
machine without an NVIDIA driver: the GPU tier runs torch unmodified. ``torch.compile``'s source is
pinned like the adapter's other objects (``harness.cpu.adapter.PATCHED_SURFACE``), so a torch whose
``compile`` changed is refused by name.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
_upstream_compile: Callable[..., Any] | None = (
    None  # torch.compile as torch defines it, once deferred
)


def _deferred_compile(model: Any = None, **options: Any) -> Any:
    """``torch.compile`` with the compiler imported (and the function compiled) at the first call."""
    import torch

    if model is None:  # @torch.compile(...) with arguments: the decorator itself
        return lambda function: _deferred_compile(function, **options)
    if not callable(model) or isinstance(model, torch.nn.Module):
        return upstream_compile()(model, **options)  # a module (or bad input): upstream decides now
    compiled: Callable[..., Any] | None = None

    @functools.wraps(model)
    def first_call_compiles(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            if (
                compile_disabled()
            ):  # what upstream's compiled function does under the flag: run eagerly
                return model(*args, **kwargs)
            compiled = upstream_compile()(model, **options)
        return compiled(*args, **kwargs)

    first_call_compiles.__dict__[_DEFERRED] = True
    return first_call_compiles


_DEFERRED = "_recompute_harness_deferred_compile"


def eager_form(function: Any) -> Callable[..., Any] | None:
    """The undecorated function of a deferred ``torch.compile`` decoration; None for anything else
    (so never on a machine with an NVIDIA driver, where nothing is deferred)."""
    if getattr(function, _DEFERRED, False):
        return function.__wrapped__
    return None


def compile_disabled() -> bool:
    """``TORCH_COMPILE_DISABLE`` as TorchDynamo reads it (``torch._dynamo.config.disable``)."""
    return os.environ.get("TORCH_COMPILE_DISABLE", "0") == "1"


def run_compiled_helpers_eagerly() -> None:
    """On CPU, MCore's torch.compile'd helpers (the MoE router's expert-bias update, squared ReLU, ...)
    run eagerly: the same results, without importing and running Inductor, whose C++ builds take
    ~25 s, in every rank. ``TORCH_COMPILE_DISABLE=0`` in the environment keeps them compiled."""
    os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")


def forget_compilations() -> None:
    """Drop what TorchDynamo has compiled in this process (if it was imported at all), so that the
    next probe pass compiles Megatron Core's ``torch.compile``'d code as a fresh process would.

    Dynamo's caches belong to the code object, across model instances: a recompile per new instance,
    a recompile limit, shapes marked dynamic after a second one. What a pass ran compiled therefore
    depended on the passes run before it in the same process. Measured on the head: mhc-tiny's bf16
    rows (its hyper-connections are ``torch.compile``'d) retained 512 B more, and its ``[]`` control
    differed from itself in 35 values, when its fp32 pass had run first in the process."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def upstream_compile() -> Callable[..., Any]:
    """``torch.compile`` as torch defines it (deferred or not)."""
    import torch

    return _upstream_compile or torch.compile


def defer_compile() -> bool:
    """Replace ``torch.compile`` by its deferred form (idempotent); False on a machine with an NVIDIA driver."""
    global _upstream_compile
    if _NVIDIA_DRIVER.exists():
        return False
    import torch

    if _upstream_compile is None:
        _upstream_compile = torch.compile
        torch.compile = _deferred_compile
    return True


class _DeferThenLoad(importlib.abc.Loader):
    """``megatron.core``'s own loader, with ``defer_compile()`` first when the package really executes."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        _remove_finder()
        defer_compile()
        self.loader.exec_module(module)

    def __getattr__(
        self, name: str
    ) -> Any:  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, name)


class _BeforeMegatronCore(importlib.abc.MetaPathFinder):
    """Finds ``megatron.core`` as the other finders do and wraps its loader: looking it up (``find_spec``,
    as ``recompute-harness revisions`` does) imports nothing; executing it defers ``torch.compile`` first."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "megatron.core":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _DeferThenLoad(spec.loader)
                return spec
        return None


def _remove_finder() -> None:
    sys.meta_path[:] = [
        finder for finder in sys.meta_path if not isinstance(finder, _BeforeMegatronCore)
    ]


def defer_compile_before_megatron_core() -> None:
    """Arrange for ``defer_compile()`` before ``megatron.core`` imports (a no-op once it has, or with a GPU)."""
    if "megatron.core" in sys.modules or _NVIDIA_DRIVER.exists():
        return
    if not any(isinstance(finder, _BeforeMegatronCore) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeMegatronCore())
