"""The environment variables that change what a run measures: the CUDA caching allocator's settings,
CUDA's connection count, Transformer Engine's kernels and graphs (``NVTE_*``), NCCL's (``NCCL_*``,
``TORCH_NCCL_*``) and HybridEP's ranks per NVLink domain. Each rank notes the values it ran with
(``env.NAME`` in ``workload.extra``) once its back end has applied its own (Bridge's recipe
defaults), and a golden is pinned to them (``harness.golden.format.workload_identity``): a night whose
allocator or dispatcher settings differ from its golden's is reported as another workload, not judged
as if equal."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

TRACKED_NAMES = frozenset(
    {
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
    }
)
TRACKED_PREFIXES = ("NVTE_", "NCCL_", "TORCH_NCCL_")
NOTE_PREFIX = "env."


def is_tracked(name: str) -> bool:
    return name in TRACKED_NAMES or name.startswith(TRACKED_PREFIXES)


def tracked_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tracked variables of ``environ`` (default: this process's), sorted by name."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in sorted(environ) if is_tracked(name)}


def environment_of_notes(notes: Mapping[str, str]) -> dict[str, str]:
    """The tracked environment a record's ``workload.extra`` notes (``env.NAME``) say a run had."""
    return {
        key[len(NOTE_PREFIX) :]: value
        for key, value in sorted(notes.items())
        if key.startswith(NOTE_PREFIX) and is_tracked(key[len(NOTE_PREFIX) :])
    }


def canonical(environment: Mapping[str, str]) -> str:
    """One comparable string: ``NAME=VALUE`` pairs sorted by name, space-separated ("" for none)."""
    return " ".join(f"{name}={environment[name]}" for name in sorted(environment))


@contextlib.contextmanager
def preserved_environ() -> Iterator[None]:
    """Run a block whose library code sets ``os.environ`` (Bridge's ``apply_environment_variables``)
    without letting those values reach anything this process starts afterwards."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
