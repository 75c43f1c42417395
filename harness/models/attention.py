"""Core attention per attention back end: MCore's local one, MLA's with ``k_channels`` / ``v_channels``,
or the CPU core attention that keeps what fused/flash attention keeps."""

from __future__ import annotations

from typing import Any

from harness.cpu.attention import ATTENTION_BACKENDS, fused_core_attention
from harness.errors import UsageError


def kv_channels_dot_product_attention() -> type:
    """The local ``DotProductAttention`` that also takes MLA's ``k_channels`` / ``v_channels``.

    MCore's local attention math is dimension-agnostic except for the output width, which it derives
    from ``kv_channels``; here it comes from ``v_channels`` as MLA requires.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class KVChannelsDotProductAttention(DotProductAttention):
        def __init__(
            self,
            *args: Any,
            k_channels: int | None = None,
            v_channels: int | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            if v_channels is not None:
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    return KVChannelsDotProductAttention


def core_attention_class(backend: str, mla: bool) -> type | None:
    """The core-attention class a layer spec gets for ``backend``; None keeps MCore's local default."""
    if backend not in ATTENTION_BACKENDS:
        raise UsageError(
            f"unknown attention backend {backend!r}; known: {', '.join(ATTENTION_BACKENDS)}"
        )
    if backend == "fused":
        return fused_core_attention()
    return kv_channels_dot_product_attention() if mla else None


def set_core_attention(block_spec: Any, backend: str, mla: bool) -> None:
    """Put ``backend``'s core attention into every layer spec of ``block_spec`` that has one (a Gated
    DeltaNet layer has none: its attention is the delta rule)."""
    attention_class = core_attention_class(backend, mla)
    if attention_class is not None:
        for layer_spec in block_spec.layer_specs:
            submodules = layer_spec.submodules.self_attention.submodules
            if hasattr(submodules, "core_attention"):
                submodules.core_attention = attention_class
