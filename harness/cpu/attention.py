"""The probe's two core-attention back ends.

- ``unfused``: Megatron Core's local ``DotProductAttention`` (``KVChannelsDotProductAttention`` for
  MLA). Autograd keeps the score matrix: the softmax output and the dropout mask/output, ``b·np·s²``
  each, as Korthikanti et al. count them.
- ``fused``: ``FusedCoreAttention``, a CPU core attention whose autograd keeps exactly what fused /
  flash attention keeps on a GPU (TE's ``FusedAttention``, flash-attn): the query, key and value
  tensors it was given (the very storages, so an output-discard checkpoint upstream frees them), its
  output, and the fp32 softmax statistics (log-sum-exp, ``b·np·s``). Forward and backward run torch's
  CPU flash-attention kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its backward); no
  score matrix is ever saved.

The CPU flash kernel needs one head size for q, k and v; MLA's value head is narrower (128 vs 192),
so the value is zero-padded for the kernel only and the output trimmed. Zero columns of v give zero
output columns and contribute nothing to dq/dk, so the gradients are exact; what is saved is the
unpadded value and output. The kernel has no dropout: attention dropout is refused here (a GPU fused
kernel keeps only its RNG seed for it, which is bytes-free anyway).
"""

from __future__ import annotations

from typing import Any

import torch

ATTENTION_BACKENDS = ("unfused", "fused")
# What a record's workload.attention_backend says for each (the unfused one keeps its historical
# name: MCore's AttnBackend.local; existing CPU goldens carry it).
RECORD_NAMES = {"unfused": "local", "fused": "fused"}


class _FlashAttention(torch.autograd.Function):
    """q [b, np, s, d], k/v [b, ng, s, d|dv] views of MCore's [s, b, n, d] tensors; out [s, b, np·dv]."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        q_view: torch.Tensor,
        k_view: torch.Tensor,
        v_view: torch.Tensor,
        causal: bool,
        scale: float,
    ) -> torch.Tensor:
        head_dim, v_dim = q_view.shape[-1], v_view.shape[-1]
        padded = (
            torch.nn.functional.pad(v_view, (0, head_dim - v_dim)) if v_dim != head_dim else v_view
        )
        out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q_view, k_view, padded, 0.0, causal, scale=scale
        )
        # [b, np, s, dv] -> [s, b, np·dv]: the layout MCore's linear_proj reads, kept as one storage.
        sq, b, np_ = query.shape[0], query.shape[1], query.shape[2]
        context = out[..., :v_dim].permute(2, 0, 1, 3).reshape(sq, b, np_ * v_dim).contiguous()
        ctx.save_for_backward(query, key, value, context, logsumexp)
        ctx.causal, ctx.scale, ctx.v_dim = causal, scale, v_dim
        return context

    @staticmethod
    def backward(ctx: Any, grad_context: torch.Tensor):
        query, key, value, context, logsumexp = ctx.saved_tensors
        q_view, k_view, v_view = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        sq, b, np_ = query.shape[0], query.shape[1], query.shape[2]
        head_dim, v_dim = q_view.shape[-1], ctx.v_dim

        def heads(
            t: torch.Tensor,
        ) -> torch.Tensor:  # [s, b, np·dv] -> [b, np, s, head_dim] (zero-padded)
            t = t.reshape(sq, b, np_, v_dim).permute(1, 2, 0, 3)
            return torch.nn.functional.pad(t, (0, head_dim - v_dim)) if v_dim != head_dim else t

        padded_v = (
            torch.nn.functional.pad(v_view, (0, head_dim - v_dim)) if v_dim != head_dim else v_view
        )
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            heads(grad_context).contiguous(),
            q_view,
            k_view,
            padded_v,
            heads(context).contiguous(),
            logsumexp,
            0.0,
            ctx.causal,
            scale=ctx.scale,
        )
        dv = dv[..., :v_dim]
        to_sbhd = lambda g: g.permute(2, 0, 1, 3).contiguous()
        return to_sbhd(dq), to_sbhd(dk), to_sbhd(dv), None, None, None, None, None


def fused_core_attention() -> type:
    """The ``FusedCoreAttention`` class (built lazily: MCore is imported only when a model is built)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.module import MegatronModule

    class FusedCoreAttention(MegatronModule):
        """Drop-in for MCore's core attention (same constructor and forward signature as
        ``DotProductAttention``, plus MLA's ``k_channels``/``v_channels``), causal masks only."""

        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str,
            attention_dropout: float | None = None,
            softmax_scale: float | None = None,
            cp_comm_type: str | None = None,
            pg_collection: Any = None,
            k_channels: int | None = None,
            v_channels: int | None = None,
        ) -> None:
            super().__init__(config=config)
            dropout = config.attention_dropout if attention_dropout is None else attention_dropout
            if dropout:
                raise ValueError(
                    "the fused CPU core attention has no attention dropout "
                    f"(attention_dropout={dropout}); set it to 0"
                )
            if config.context_parallel_size != 1:
                raise ValueError(
                    "the fused CPU core attention does not implement context parallelism"
                )
            self.attn_mask_type = attn_mask_type
            self._causal_types = (AttnMaskType.causal,)
            tp = parallel_state.get_tensor_model_parallel_world_size()
            self.num_attention_heads_per_partition = config.num_attention_heads // tp
            head_dim = k_channels if k_channels is not None else config.kv_channels
            self.softmax_scale = softmax_scale if softmax_scale is not None else head_dim**-0.5

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: torch.Tensor | None = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            if packed_seq_params is not None or attention_bias is not None:
                raise ValueError(
                    "the fused CPU core attention takes no packed sequences or attention bias"
                )
            mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
            if mask_type not in self._causal_types:
                raise ValueError(
                    f"the fused CPU core attention implements causal masks only, got {mask_type}"
                )
            views = [
                t.permute(1, 2, 0, 3) for t in (query, key, value)
            ]  # [s, b, n, d] -> [b, n, s, d]
            return _FlashAttention.apply(query, key, value, *views, True, float(self.softmax_scale))

    return FusedCoreAttention
