"""Which settings the CUDA caching allocator actually runs with.

torch parses ``PYTORCH_CUDA_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``) once, the first time anything
reads the allocator's settings, and keeps that string: the read can happen without CUDA starting
(``torch.cuda.is_initialized()`` stays False), so only the allocator's own answer says whether a
value set later (Bridge's recipe environment) took effect.
"""

from __future__ import annotations

from collections.abc import Mapping

ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def allocator_settings() -> str:
    """The settings string the allocator parsed (reading it fixes it for the life of the process)."""
    import torch

    return torch._C._accelerator_getAllocatorSettings()


def ignored_allocator_env(applied: Mapping[str, str]) -> str | None:
    """A one-line reason when the allocator runs with other settings than ``applied`` asked for, else None."""
    wanted = {name: value for name, value in applied.items() if name in ALLOCATOR_ENV}
    if not wanted:
        return None
    actual = allocator_settings()
    for name, value in wanted.items():
        if value.strip() != actual.strip():
            return (
                f"{name}={value} was set, but the allocator had already read its settings "
                f"({actual!r}): its peaks are not the recipe's"
            )
    return None
