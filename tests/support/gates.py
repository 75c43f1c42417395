"""GPU-tier gates: each returns None when the machine has what a test needs, else a skip reason that
names exactly what is missing (CUDA, GPU count, SM 9.0 for H100 goldens, Transformer Engine,
mamba-ssm, Megatron Bridge)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from harness.run.recipes import import_failure


@cache
def _import_failure(module: str) -> str | None:
    failure = import_failure([module])
    return None if failure is None else failure[1]


def missing(
    *,
    gpus: int = 1,
    sm: str | None = None,
    te: bool = False,
    mamba: bool = False,
    bridge: bool = False,
) -> str | None:
    """``gpus=0``: no GPU at all (Bridge builds and validates its configs on the host)."""
    import torch

    if gpus > 0 and not torch.cuda.is_available():
        return "needs CUDA: no CUDA device is visible"
    found = torch.cuda.device_count()
    if found < gpus:
        return f"needs {gpus} GPUs: {found} visible"
    if sm is not None:
        major, minor = torch.cuda.get_device_capability(0)
        if f"{major}.{minor}" != sm:
            return f"needs SM {sm} (the goldens' H100 profile): this GPU is SM {major}.{minor}"
    # Bridge's training (not its config validation) imports nvidia-resiliency-ext: Bridge on GPUs needs it.
    for wanted, module, name in (
        (te, "transformer_engine", "Transformer Engine"),
        (mamba, "mamba_ssm", "mamba-ssm"),
        (bridge, "megatron.bridge", "Megatron Bridge 0.6.2"),
        (bridge and gpus > 0, "nvidia_resiliency_ext.inprocess", "nvidia-resiliency-ext"),
    ):
        if wanted and (reason := _import_failure(module)) is not None:
            return f"needs {name}: `import {module}` fails ({reason})"
    return None


def require(**needs: Any) -> None:
    """Skip the calling test, with the reason, unless the machine has everything in ``needs``."""
    reason = missing(**needs)
    if reason is not None:
        pytest.skip(reason)
