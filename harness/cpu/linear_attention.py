"""CPU stand-ins for the flash-linear-attention (fla) kernels of Megatron Core's Gated DeltaNet.

MCore's ``GatedDeltaNet`` calls three fla kernels (Triton on a GPU): ``causal_conv1d`` (the short
convolution over q/k/v, SiLU fused), ``l2norm`` (q and k per head) and ``chunk_gated_delta_rule``
(the delta-rule recurrence, chunked). Without fla MCore binds them to ``None`` and refuses to build the
layer. Each stand-in here is a ``torch.autograd.Function`` whose autograd keeps exactly what fla's
autograd function keeps for backward (fla-core 0.6.0: the same tensors, shapes and dtypes; the very
input storages where fla saves its inputs) and recomputes the rest in backward, the discipline of
``harness.cpu.attention``'s fused back end. What each keeps:

- ``causal_conv1d`` (fla's ``CausalConv1dFunction``, the default ``triton`` back end): the input ``x``
  as given (not made contiguous: MCore passes a slice of the input projection's output, so the whole
  projection stays alive), the weight and the bias (None in MCore's GDN). The convolution and its
  activation are recomputed in backward.
- ``l2norm`` (fla's ``L2NormFunction``): the output ``y`` and ``rstd`` (fp32, one per row).
- ``chunk_gated_delta_rule`` (fla's ``ChunkGatedDeltaRuleFunction``, without the in-kernel l2norm,
  sigmoid or gate, as MCore calls it): q, k, v and beta as given, the chunk-local cumulative sum of
  the gate (fp32, ``[B, T, H]``) and ``A`` (``[B, T, H, 64]`` in k's dtype: per chunk of 64 tokens,
  the inverse of ``I + tril(beta_i k_i.k_j exp(G_i - G_j), -1)``, rows per token). Backward rebuilds
  the rest (the WY factors, the per-chunk states, the output) from those, using the saved ``A``
  rather than solving again, as fla's backward does.

Math in fp32, outputs in the input dtype, as the Triton kernels compute. Only what MCore's GDN uses is
implemented (no packed sequences, initial or final states, context parallelism): anything else is
refused with ``NotImplementedError``. ``harness.cpu.adapter`` binds these into Megatron Core where fla
is absent (part 5 of the adapter).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# fla's chunk size for the gated delta rule (its default, and what MCore leaves it at): the saved A
# has this many columns whatever the sequence length.
CHUNK = 64


def _fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype != torch.float32 else t


def _refuse(what: str, value: Any) -> None:
    if value is not None and value is not False:
        raise NotImplementedError(f"the CPU stand-in of fla's kernels does not implement {what}")


# --- causal_conv1d --------------------------------------------------------------------------------


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: Any):
    """Depthwise causal convolution of x [B, T, D] with weight [D, W], then the activation (fp32)."""
    length, width = x.shape[1], weight.shape[-1]
    y = F.conv1d(
        _fp32(x).transpose(1, 2),
        _fp32(weight).unsqueeze(1),
        None if bias is None else _fp32(bias),
        padding=width - 1,
        groups=weight.shape[0],
    )[..., :length]
    y = F.silu(y) if activation in ("silu", "swish") else y
    return y.transpose(1, 2)


class _CausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight, bias)
        ctx.activation = activation
        return _conv(x, weight, bias, activation).to(x.dtype).contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight, bias = ctx.saved_tensors
        leaves = [
            t.detach().requires_grad_(needs)
            for t, needs in zip((x, weight), ctx.needs_input_grad[:2], strict=True)
        ]
        bias_leaf = None if bias is None else bias.detach().requires_grad_(ctx.needs_input_grad[2])
        with torch.enable_grad():
            y = _conv(leaves[0], leaves[1], bias_leaf, ctx.activation)
            wanted = [t for t in (*leaves, bias_leaf) if t is not None and t.requires_grad]
            grads = iter(torch.autograd.grad(y, wanted, _fp32(grad)))
        out = [
            next(grads).to(t.dtype) if t is not None and t.requires_grad else None
            for t in (*leaves, bias_leaf)
        ]
        return out[0], out[1], out[2], None


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    activation: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
    **unsupported: Any,
) -> tuple[torch.Tensor, None]:
    """fla's ``causal_conv1d`` (x ``[B, T, D]``, weight ``[D, W]``): ``(y, None)``."""
    for what, value in (
        ("a residual", residual),
        ("an initial state", initial_state),
        ("a final state", output_final_state),
        ("packed sequences (cu_seqlens)", cu_seqlens),
        *unsupported.items(),
    ):
        _refuse(what, value)
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError(f"causal_conv1d activation {activation!r}")
    return _CausalConv1d.apply(x, weight, bias, activation), None


# --- l2norm ---------------------------------------------------------------------------------------


class _L2Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float, output_dtype: torch.dtype | None):
        xf = _fp32(x)
        rstd = torch.rsqrt(xf.pow(2).sum(-1) + eps)
        y = (xf * rstd.unsqueeze(-1)).to(output_dtype or x.dtype)
        ctx.save_for_backward(y, rstd)
        ctx.x_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        y, rstd = ctx.saved_tensors
        yf, gf, r = _fp32(y), _fp32(grad), rstd.unsqueeze(-1)
        dx = gf * r - (gf * yf).sum(-1, keepdim=True) * yf * r
        return dx.to(ctx.x_dtype), None, None


def l2norm(
    x: torch.Tensor, eps: float = 1e-6, output_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """fla's ``l2norm``: ``x / sqrt(sum(x^2) + eps)`` over the last dimension."""
    return _L2Norm.apply(x, eps, output_dtype)


# --- chunk_gated_delta_rule -----------------------------------------------------------------------


def _chunks(t: torch.Tensor, padded: int, edge: bool = False) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, N, CHUNK, ...] (fp32), padded to ``padded`` tokens with zeros, or
    with the last token (``edge``: cumulative gates stay flat past the end, so no decay factor
    exp(G_i - G_j) of a padded token overflows)."""
    extra, missing = t.dim() - 3, padded - t.shape[1]
    if edge:
        t = torch.cat([_fp32(t), _fp32(t[:, -1:]).expand(-1, missing, *t.shape[2:])], dim=1)
    else:
        t = F.pad(_fp32(t), (0, 0) * extra + (0, 0, 0, missing))
    batch, _, heads = t.shape[:3]
    t = t.reshape(batch, padded // CHUNK, CHUNK, heads, *t.shape[3:])
    return t.movedim(3, 1)


def _unchunk(t: torch.Tensor, length: int) -> torch.Tensor:
    """[B, H, N, CHUNK, ...] -> [B, T, H, ...], in storage of its own (a slice of the padded tensor
    would keep the padding alive wherever it is saved)."""
    t = t.movedim(1, 3)
    t = t.reshape(t.shape[0], -1, *t.shape[3:])[:, :length]
    return t.clone(memory_format=torch.contiguous_format)


def chunk_local_cumsum(g: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Cumulative sum of g [B, T, H] restarting every CHUNK tokens (fp32); reversed within chunks for
    the gradient of that sum."""
    padded = -(-g.shape[1] // CHUNK) * CHUNK
    chunks = _chunks(g, padded)
    if reverse:
        chunks = chunks.flip(-1).cumsum(-1).flip(-1)
    else:
        chunks = chunks.cumsum(-1)
    return _unchunk(chunks, g.shape[1])


def _causal(diag: bool, device: torch.device) -> torch.Tensor:
    return torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=device).tril(0 if diag else -1)


def _decay(gates: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp(G_i - G_j) where ``mask`` holds, else 0 (masked before exp: G_i - G_j > 0 above it)."""
    diff = gates.unsqueeze(-1) - gates.unsqueeze(-2)
    return diff.masked_fill(~mask, float("-inf")).exp()


def _strict_lower(k: torch.Tensor, gates: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """tril(beta_i k_i.k_j exp(G_i - G_j), -1) per chunk: ``I`` plus this is what A inverts."""
    return beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * _decay(gates, _causal(False, k.device))


def _delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    beta: torch.Tensor,
    inverse: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The chunked gated delta rule on [B, H, N, C, ...] fp32 chunks, ``inverse`` being A per chunk.

    Within a chunk the WY factors w = A (beta exp(G) k) and u = A (beta v) turn the recurrence into
    matrix products; across chunks the state S [K, V] carries over (decayed by the chunk's last G).
    """
    w = inverse @ (k * (beta * gates.exp()).unsqueeze(-1))
    u = inverse @ (v * beta.unsqueeze(-1))
    scores = (q @ k.transpose(-1, -2)) * _decay(gates, _causal(True, q.device))
    state = q.new_zeros(q.shape[0], q.shape[1], k.shape[-1], v.shape[-1])
    outputs = []
    for n in range(q.shape[2]):
        g_n = gates[:, :, n]
        v_new = u[:, :, n] - w[:, :, n] @ state
        outputs.append((q[:, :, n] * g_n.exp().unsqueeze(-1)) @ state + scores[:, :, n] @ v_new)
        last = g_n[..., -1:]
        carried = k[:, :, n] * (last - g_n).exp().unsqueeze(-1)
        state = state * last.exp().unsqueeze(-1) + carried.transpose(-1, -2) @ v_new
    return torch.stack(outputs, dim=2) * scale


class _ChunkGatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        length = q.shape[1]
        padded = -(-length // CHUNK) * CHUNK
        gates = chunk_local_cumsum(g)
        kc, gc, bc = _chunks(k, padded), _chunks(gates, padded, edge=True), _chunks(beta, padded)
        eye = torch.eye(CHUNK, device=q.device)
        inverse = torch.linalg.solve_triangular(
            eye + _strict_lower(kc, gc, bc), eye, upper=False, unitriangular=True
        )
        out = _delta_rule(_chunks(q, padded), kc, _chunks(v, padded), gc, bc, inverse, scale)
        # fla keeps A in k's dtype, one row of 64 per token.
        saved_inverse = _unchunk(inverse, length).to(k.dtype)
        ctx.save_for_backward(q, k, v, gates, beta, saved_inverse)
        ctx.scale = scale
        return _unchunk(out, length).to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        q, k, v, gates, beta, saved_inverse = ctx.saved_tensors
        length = q.shape[1]
        padded = -(-length // CHUNK) * CHUNK
        leaves = [
            _chunks(t, padded, edge=t is gates).detach().requires_grad_()
            for t in (q, k, v, gates, beta)
        ]
        # Padded tokens' rows of A are zero: they reach no real token's output (causality), whose
        # gradients alone are propagated.
        fixed = _chunks(saved_inverse, padded)
        with torch.enable_grad():
            qc, kc, vc, gc, bc = leaves
            eye = torch.eye(CHUNK, device=q.device)
            # One Newton step around the saved inverse: its value is A, its derivative -A dM A is
            # the inverse's, so the triangular solve is not redone (fla's backward reads A too).
            inverse = 2 * fixed - fixed @ (eye + _strict_lower(kc, gc, bc)) @ fixed
            out = _delta_rule(qc, kc, vc, gc, bc, inverse, ctx.scale)
            grads = torch.autograd.grad(out, leaves, _chunks(grad, padded))
        dq, dk, dv, d_gates, dbeta = (_unchunk(t, length) for t in grads)
        dg = chunk_local_cumsum(d_gates, reverse=True)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, dbeta.to(beta.dtype), None


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    **unsupported: Any,
) -> tuple[torch.Tensor, None]:
    """fla's ``chunk_gated_delta_rule`` (q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g and beta
    ``[B, T, H]``, g the log decay): ``(o, None)``, o ``[B, T, H, V]``."""
    for what, value in (
        ("an initial state", initial_state),
        ("a final state", output_final_state),
        ("the in-kernel l2norm", use_qk_l2norm_in_kernel),
        ("packed sequences (cu_seqlens)", cu_seqlens),
        *unsupported.items(),
    ):
        _refuse(what, value)
    if q.shape[2] != v.shape[2] or k.shape[2] != v.shape[2]:
        raise NotImplementedError(
            "the CPU gated delta rule takes as many q/k heads as v heads (MCore repeats them)"
        )
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    return _ChunkGatedDeltaRule.apply(q, k, v, g, beta, scale), None
