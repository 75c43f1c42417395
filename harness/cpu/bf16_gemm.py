"""CPU adapter part 11: bf16 matrix products computed by torch's fp32 kernels, for the estimate.

Many CPUs have no bf16 GEMM kernel in torch: there a bf16 product falls back to scalar code (0.84
GFLOP/s measured on this project's 2-core CI machine, 2026-12-04, against 77 in fp32), and the
estimate's full-width layers (64 experts of hidden 2048, at three sequence lengths) ran past its
600 s limit. ``bf16_gemms_on_fp32_kernels`` is a dispatch mode that computes ``mm``, ``addmm``,
``bmm`` and ``baddbmm`` of bf16 CPU tensors in fp32 and rounds the result to bf16, as a bf16 GEMM
with fp32 accumulation does.

Why it changes nothing the estimate measures: a dispatch mode runs below autograd, so every tensor
autograd saves (the bf16 inputs, the bf16 output) is the tensor it saves without the mode, with the
same shape, dtype and storage; the fp32 copies are temporaries made beneath any memory tracker
entered inside the mode (MemTracker sees the bf16 product as one op), as a GPU's GEMM workspace is
unseen. Only values differ, in the last bits of a rounding, and the estimate counts bytes: its byte
counts are sums over tokens, which routing's per-expert split does not change
(``harness.estimate.worker``). Replaces a torch CPU kernel only, never Megatron Core code; the
probe does not use it (its goldens compare replays bitwise on the native kernels).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_GEMMS = frozenset(
    {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm}
)


def _bf16_on_cpu(tensors: list[torch.Tensor]) -> bool:
    return bool(tensors) and all(
        t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in tensors
    )


class _Bf16GemmsOnFp32Kernels(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func.overloadpacket in _GEMMS and _bf16_on_cpu(
            [a for a in args if isinstance(a, torch.Tensor)]
        ):
            out = kwargs.pop("out", None)
            upcast = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
            result = func.overloadpacket.default(*upcast, **kwargs).to(torch.bfloat16)
            if out is None:
                return result
            return out.copy_(result)
        return func(*args, **kwargs)


@contextlib.contextmanager
def bf16_gemms_on_fp32_kernels() -> Iterator[None]:
    """Inside: bf16 CPU GEMMs run on the fp32 kernels (module doc). Enter it before any memory
    tracker, so that the tracker sees each product as the bf16 op it is."""
    with _Bf16GemmsOnFp32Kernels():
        yield
