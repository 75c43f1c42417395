"""A CPU RMSNorm whose autograd keeps what a fused GPU RMSNorm keeps: the input and the fp32 rstd.

On CPU, ``torch.rms_norm`` is a composite: autograd keeps three fp32 ``[tokens, h]`` intermediates
(12 bytes per element at 16-bit inputs). Transformer Engine's RMSNorm (the norm of every TE recipe)
keeps the input, the weight and ``rsigma`` (fp32, one per token) instead. The estimate measures GPU
recipes, so its layers use this norm (the CPU probe keeps MCore's local ``WrappedTorchNorm``, whose
goldens pin torch's own behaviour). Numerics: fp32 math, output in the input dtype, as TE computes.

Per token, so it is the same on a sequence-parallel shard: unlike ``WrappedTorchNorm`` it accepts
sequence parallel, and marks its weight ``sequence_parallel`` as MCore's SP norms do (the attribute
MCore's gradient all-reduce reads).
"""

from __future__ import annotations

from typing import Any

import torch


def _compute(t: torch.Tensor) -> torch.Tensor:
    """16-bit inputs are normalised in fp32; fp32/fp64 in their own precision."""
    return t.float() if t.element_size() < 4 else t


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = _compute(x)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * _compute(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = _compute(x) * rstd
        grad_f = _compute(grad)
        gy = grad_f * _compute(weight)
        dx = rstd * (gy - xhat * (gy * xhat).mean(-1, keepdim=True))
        dw = (grad_f * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class FusedRMSNorm(torch.nn.Module):
    """Built like MCore's norms: ``FusedRMSNorm(config=..., hidden_size=..., eps=...)``."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)


def norm_column_parallel_linear() -> type:
    """``NormColumnParallelLinear``: TE's ``TELayerNormColumnParallelLinear`` (RMSNorm) on CPU.

    Megatron Core's TE hybrid spec fuses the attention (and MLP) layers' norm into the following
    column-parallel linear and leaves the layer's own norm an ``IdentityOp``; ``TransformerLayer``
    then never sets ``recompute_input_layernorm`` there, so ``layernorm`` does not reach those
    layers on a GPU. The same placement on CPU keeps that decision MCore's. Bytes: TE's module keeps
    the norm's input, ``rsigma`` and the norm's output (the GEMM's input); ``FusedRMSNorm`` followed
    by MCore's ``ColumnParallelLinear`` keeps exactly those. Built lazily: MCore is imported only
    when a layer is built.
    """
    from megatron.core.tensor_parallel import ColumnParallelLinear

    class NormColumnParallelLinear(ColumnParallelLinear):
        def __init__(
            self, input_size: int, output_size: int, *, config: Any, **kwargs: Any
        ) -> None:
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.norm = FusedRMSNorm(config, input_size, eps=config.layernorm_epsilon)

        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return super().forward(self.norm(x), *args, **kwargs)

    return NormColumnParallelLinear
