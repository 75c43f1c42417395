"""GPU-tier gates: each returns None when the machine has what a test needs, else a skip reason that
names exactly what is missing (CUDA, GPU count, SM 9.0 for H100 goldens, Transformer Engine,
mamba-ssm, Megatron Bridge at the project's pin). What the machine has is gated; a golden never is:
GPU tests judge their records with the plugin's ``recompute_golden`` fixture, whose missing golden
fails the test by name."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from harness.run.recipes import import_failure

ROOT = Path(__file__).resolve().parents[2]


def _bridge_pin() -> str:
    """The Megatron Bridge version of the project's ``bridge`` extra (pyproject.toml), e.g. 0.6.2."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    (pin,) = [re.fullmatch(r"megatron-bridge==([\w.]+)", item) for item in extras["bridge"]]
    assert pin is not None, extras["bridge"]
    return pin.group(1)


BRIDGE_VERSION = _bridge_pin()


def version_gap(distribution: str, wanted: str) -> str | None:
    """None when ``distribution`` is installed at exactly ``wanted``, else what is installed instead: an
    image with an older Bridge imports fine and then lacks the recipes and callbacks the tests use."""
    try:
        found = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return f"{distribution} is not installed"
    return None if found == wanted else f"{distribution} {found} is installed"


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
    if bridge and (gap := version_gap("megatron-bridge", BRIDGE_VERSION)) is not None:
        return f"needs Megatron Bridge {BRIDGE_VERSION}: {gap}"
    # Bridge's training (not its config validation) imports nvidia-resiliency-ext: Bridge on GPUs needs it.
    for wanted, module, name in (
        (te, "transformer_engine", "Transformer Engine"),
        (mamba, "mamba_ssm", "mamba-ssm"),
        (bridge, "megatron.bridge", f"Megatron Bridge {BRIDGE_VERSION}"),
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


# Below this bf16 GEMM rate the CPU runs torch's scalar fallback (a CPU without AVX-512 BF16: measured
# 1 GFLOP/s on a 2-core AVX2 machine, where fp32 reached 50); a kernel runs at tens of GFLOP/s.
_BF16_GEMM_MIN_GFLOPS = 5.0


@cache
def slow_bf16_gemm() -> str | None:
    """None where torch has a bf16 GEMM kernel for this CPU; else the reason, with what was measured.

    The full-width estimates run bf16 MoE layers (the worker computes their products in fp32,
    harness/cpu/bf16_gemm.py): about 20 s on a CPU with a bf16 kernel (and the AVX-512 that comes
    with one), 90 s on this project's 2-core AVX2 machine, more than the CPU tier's share.
    """
    import time

    import torch

    m, k, n = 128, 1024, 1024
    a, b = torch.ones(m, k, dtype=torch.bfloat16), torch.ones(k, n, dtype=torch.bfloat16)
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - started)
    gflops = 2 * m * k * n / min(seconds) / 1e9
    if gflops >= _BF16_GEMM_MIN_GFLOPS:
        return None
    return (
        f"this CPU has no bf16 GEMM kernel in torch {torch.__version__} ({gflops:.1f} GFLOP/s measured, "
        f"{_BF16_GEMM_MIN_GFLOPS:.0f} needed): a full-width estimate takes ~90 s on such a CPU, "
        "past the tier's share (run it by hand: docs/estimate.md)"
    )
