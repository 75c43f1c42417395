"""The process environment that changes what a row measures: which variables, and keeping them honest.

The CUDA caching allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` once, CUDA its connection count at
initialisation, Transformer Engine its ``NVTE_*`` switches (kernels, SM margins, CUDA graphs), NCCL and
torch's NCCL bindings their ``NCCL_*`` / ``TORCH_NCCL_*`` settings, HybridEP its NVLink domain layout:
each one moves peaks or step time without any config field saying so. Every rank reports these
variables as it runs them; the record keeps them (``workload.environment``) and a golden is pinned to
them, so a row whose environment differs from its golden's is refused as another workload.

Megatron Bridge's ``apply_environment_variables`` writes recipe defaults into ``os.environ`` (it runs
inside ``runtime_config_update``); a caller that validates a config in its own process keeps its
environment with ``preserved_environment``, so nothing leaks into the rows it launches later.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

# Whole names: the allocator, CUDA's connection count, HybridEP's layout (MCore's fused_a2a and
# DeepEP's hybrid_ep read these; Bridge's MoE recipes set them).
RECORDED_NAMES = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API",
    "NVLINK_DOMAIN_SIZE",
    "USE_MNNVL",
)
# Families: Transformer Engine, NCCL, torch's NCCL process group.
RECORDED_PREFIXES = ("NVTE_", "NCCL_", "TORCH_NCCL_")


# What torchrun's agent gives every worker when the launcher leaves it unset (torch's
# local_elastic_agent: ``os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", str(1))``): declared with it.
TORCHRUN_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def is_recorded(name: str) -> bool:
    return name in RECORDED_NAMES or name.startswith(RECORDED_PREFIXES)


def recorded_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that change allocator, dispatcher, kernels or graphs, sorted by name."""
    return {name: env[name] for name in sorted(env) if is_recorded(name)}


def declared_environment(env: Mapping[str, str]) -> dict[str, str]:
    """A row's declared environment: the recorded variables of the launching ``env``, with torchrun's own
    defaults where it leaves them unset (what every rank must find at its start)."""
    return recorded_environment({**TORCHRUN_DEFAULTS, **env})


def launch_environment(base: Mapping[str, str], declared: Mapping[str, str]) -> dict[str, str]:
    """``base`` with its recorded variables replaced by exactly ``declared``: what a row is started with,
    whatever the launching process has set in its own ``os.environ`` since the row was declared."""
    kept = {name: value for name, value in base.items() if not is_recorded(name)}
    return {**kept, **declared}


def environment_differences(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """``NAME expected -> actual`` for every recorded variable that differs (unset: ``<unset>``)."""
    return [
        f"{name} {expected.get(name, '<unset>')} -> {actual.get(name, '<unset>')}"
        for name in sorted(set(expected) | set(actual))
        if expected.get(name) != actual.get(name)
    ]


@contextlib.contextmanager
def preserved_environment() -> Iterator[None]:
    """Run the body, then put ``os.environ`` back exactly as it was (added names removed, changed ones
    restored)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in [name for name in os.environ if name not in saved]:
            del os.environ[name]
        os.environ.update(saved)
