"""CPU stand-ins for the flash-linear-attention (fla) kernels of Megatron Core's Gated DeltaNet.

MCore's ``GatedDeltaNet`` calls three fla kernels (Triton on a GPU): ``causal_conv1d`` (the short
convolution over q/k/v, SiLU fused), ``l2norm`` (q and k per head) and ``chunk_gated_delta_rule``
(the delta-rule recurrence, chunked). Without fla MCore binds them to ``None`` and refuses to build the
layer. Each stand-in here is a ``torch.autograd.Function`` whose autograd keeps exactly what fla's
autograd function keeps for backward (fla-core 0.6.0: the same tensors, shapes and dtypes; the very
input storages where fla saves its inputs). Backward recomputes what it needs from those alone, as
fla's backward kernels do, and derives the gradients by hand with grad mode off, as a kernel does
(the probe counts ops run with grad mode on in backward as replay, which is what Megatron Core's
checkpoints do, not its kernels; ``harness.cpu.attention``'s fused back end keeps the same
discipline). What each keeps:

- ``causal_conv1d`` (fla's ``CausalConv1dFunction``, the default ``triton`` back end): the input ``x``
  as given (not made contiguous: MCore passes a slice of the input projection's output, so the whole
  projection stays alive), the weight and the bias (None in MCore's GDN). The convolution is
  recomputed in backward for the activation's derivative.
- ``l2norm`` (fla's ``L2NormFunction``): the output ``y`` and ``rstd`` (fp32, one per row).
- ``chunk_gated_delta_rule`` (fla's ``ChunkGatedDeltaRuleFunction``, without the in-kernel l2norm,
  sigmoid or gate, as MCore calls it): q, k, v and beta as given, the chunk-local cumulative sum of
  the gate (fp32, ``[B, T, H]``) and ``A`` (``[B, T, H, 64]`` in k's dtype: per chunk of 64 tokens,
  the inverse of ``I + tril(beta_i k_i.k_j exp(G_i - G_j), -1)``, rows per token). Backward rebuilds
  the WY factors and the per-chunk states from those, with the saved ``A`` (no second triangular
  solve, as in fla), then runs the chunks in reverse.

Math in fp32, outputs in the input dtype, as the Triton kernels compute. Only what MCore's GDN uses is
implemented (no packed sequences, initial or final states, context parallelism): anything else is
refused with ``NotImplementedError``. ``harness.cpu.adapter`` binds these into Megatron Core where fla
is absent (part 6 of the adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
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
        width, channels = weight.shape[-1], weight.shape[0]
        xt, kernel = _fp32(x).transpose(1, 2), _fp32(weight).unsqueeze(1)
        # The convolution again (as fla's backward kernel recomputes it), then SiLU's derivative.
        grad_pre = _fp32(grad).transpose(1, 2)
        if ctx.activation in ("silu", "swish"):
            pre = _conv(x, weight, bias, None).transpose(1, 2)
            gate = torch.sigmoid(pre)
            grad_pre = grad_pre * gate * (1 + pre * (1 - gate))
        # The causal output is the first `length` of the padded convolution's; its tail had no
        # gradient.
        full = F.pad(grad_pre, (0, width - 1))
        dx = torch.nn.grad.conv1d_input(
            xt.shape, kernel, full, padding=width - 1, groups=channels
        ).transpose(1, 2)
        dw = torch.nn.grad.conv1d_weight(
            xt, kernel.shape, full, padding=width - 1, groups=channels
        ).squeeze(1)
        db = None if bias is None else grad_pre.sum((0, 2)).to(bias.dtype)
        return dx.to(x.dtype), dw.to(weight.dtype), db, None


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


@dataclass
class _Chunked:
    """The chunked gated delta rule's forward quantities (fp32, ``[B, H, N, C, ...]``)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    gates: torch.Tensor  # chunk-local cumulative log decay G
    beta: torch.Tensor
    inverse: torch.Tensor  # A = (I + L)^-1 per chunk
    w: torch.Tensor  # WY factors: w = A (beta exp(G) k), u = A (beta v)
    u: torch.Tensor
    scores: torch.Tensor  # (q k^T) * exp(G_i - G_j), j <= i
    states: list[torch.Tensor]  # the state S [K, V] entering each chunk
    v_new: list[torch.Tensor]  # u - w S per chunk
    output: torch.Tensor  # unscaled


def _chunked(q, k, v, gates, beta, inverse) -> _Chunked:
    """Within a chunk the WY factors turn the recurrence S_t = exp(g_t)(I - beta_t k_t k_t^T)
    S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t into matrix products; across chunks the state carries
    over, decayed by the chunk's last G."""
    w = inverse @ (k * (beta * gates.exp()).unsqueeze(-1))
    u = inverse @ (v * beta.unsqueeze(-1))
    scores = (q @ k.transpose(-1, -2)) * _decay(gates, _causal(True, q.device))
    state = q.new_zeros(q.shape[0], q.shape[1], k.shape[-1], v.shape[-1])
    states, news, outputs = [], [], []
    for n in range(q.shape[2]):
        g_n = gates[:, :, n]
        v_new = u[:, :, n] - w[:, :, n] @ state
        states.append(state)
        news.append(v_new)
        outputs.append((q[:, :, n] * g_n.exp().unsqueeze(-1)) @ state + scores[:, :, n] @ v_new)
        last = g_n[..., -1:]
        carried = k[:, :, n] * (last - g_n).exp().unsqueeze(-1)
        state = state * last.exp().unsqueeze(-1) + carried.transpose(-1, -2) @ v_new
    output = torch.stack(outputs, dim=2)
    return _Chunked(q, k, v, gates, beta, inverse, w, u, scores, states, news, output)


def _both_ends(d_log: torch.Tensor) -> torch.Tensor:
    """d/dG of a term f(G_i - G_j) from its log-derivative matrix: +row sums, -column sums."""
    return d_log.sum(-1) - d_log.sum(-2)


def _delta_rule_grads(c: _Chunked, d_out: torch.Tensor) -> list[torch.Tensor]:
    """dq, dk, dv, dG, dbeta of ``sum(d_out * output)``, derived by hand (grad mode off)."""
    exp_g = c.gates.exp()
    dq, dk, dv = torch.zeros_like(c.q), torch.zeros_like(c.k), torch.zeros_like(c.v)
    d_gates, d_beta = torch.zeros_like(c.gates), torch.zeros_like(c.beta)
    dw, du, d_scores = torch.zeros_like(c.w), torch.zeros_like(c.u), torch.zeros_like(c.scores)
    d_state = torch.zeros_like(c.states[0])  # of the state leaving the chunk
    # Across chunks, last to first.
    for n in reversed(range(c.q.shape[2])):
        state, v_new, g_n, do = c.states[n], c.v_new[n], c.gates[:, :, n], d_out[:, :, n]
        last = g_n[..., -1:]
        to_end = (last - g_n).exp().unsqueeze(-1)
        q_decayed = c.q[:, :, n] * exp_g[:, :, n].unsqueeze(-1)
        # state' = exp(last) state + (k exp(last - G))^T v_new
        d_carried = v_new @ d_state.mT
        carried_log = (d_carried * c.k[:, :, n] * to_end).sum(-1)
        dk[:, :, n] += d_carried * to_end
        d_gates[:, :, n] -= carried_log
        d_gates[:, :, n, -1] += carried_log.sum(-1) + last.squeeze(-1).exp() * (
            state * d_state
        ).sum((-1, -2))
        d_v_new = c.k[:, :, n] * to_end @ d_state
        # output = (q exp(G)) state + scores v_new
        d_scores[:, :, n] = do @ v_new.mT
        d_v_new = d_v_new + c.scores[:, :, n].mT @ do
        d_q_decayed = do @ state.mT
        dq[:, :, n] += d_q_decayed * exp_g[:, :, n].unsqueeze(-1)
        d_gates[:, :, n] += (d_q_decayed * q_decayed).sum(-1)
        # v_new = u - w state
        du[:, :, n] = d_v_new
        dw[:, :, n] = -d_v_new @ state.mT
        d_state = q_decayed.mT @ do + last.exp().unsqueeze(-1) * d_state - c.w[:, :, n].mT @ d_v_new
    # Within chunks, all at once. scores = (q k^T) * exp(G_i - G_j):
    decay = _decay(c.gates, _causal(True, c.q.device))
    d_qk = d_scores * decay
    dq += d_qk @ c.k
    dk += d_qk.mT @ c.q
    d_gates += _both_ends(d_scores * c.scores)
    # w = A (beta exp(G) k), u = A (beta v):
    d_inverse = (
        dw @ (c.k * (c.beta * exp_g).unsqueeze(-1)).mT + du @ (c.v * c.beta.unsqueeze(-1)).mT
    )
    d_kg, d_vb = c.inverse.mT @ dw, c.inverse.mT @ du
    dk += d_kg * (c.beta * exp_g).unsqueeze(-1)
    kg_log = (d_kg * c.k).sum(-1) * exp_g
    d_beta += kg_log + (d_vb * c.v).sum(-1)
    d_gates += kg_log * c.beta
    dv += d_vb * c.beta.unsqueeze(-1)
    # A = (I + L)^-1, L = tril(beta_i k_i.k_j exp(G_i - G_j), -1): dL = -A^T dA A^T below the
    # diagonal.
    strict = _causal(False, c.q.device)
    d_lower = -(c.inverse.mT @ d_inverse @ c.inverse.mT) * strict
    gram, decay_strict = c.k @ c.k.mT, _decay(c.gates, strict)
    d_beta += (d_lower * gram * decay_strict).sum(-1)
    d_gram = d_lower * c.beta.unsqueeze(-1) * decay_strict
    dk += (d_gram + d_gram.mT) @ c.k
    d_gates += _both_ends(d_lower * c.beta.unsqueeze(-1) * gram * decay_strict)
    return [dq, dk, dv, d_gates, d_beta]


def _rule_forward(q, k, v, gates, beta, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The output (fp32, ``[B, T, H, V]``) and A as fla keeps it (k's dtype, one row of 64 per token)
    of the rule over ``[B, T, H, ...]`` inputs, ``gates`` the chunk-local cumulative log decay."""
    length = k.shape[1]
    padded = -(-length // CHUNK) * CHUNK
    kc, gc, bc = _chunks(k, padded), _chunks(gates, padded, edge=True), _chunks(beta, padded)
    eye = torch.eye(CHUNK, device=k.device)
    inverse = torch.linalg.solve_triangular(
        eye + _strict_lower(kc, gc, bc), eye, upper=False, unitriangular=True
    )
    chunked = _chunked(_chunks(q, padded), kc, _chunks(v, padded), gc, bc, inverse)
    return _unchunk(chunked.output * scale, length), _unchunk(inverse, length).to(k.dtype)


def _rule_backward(q, k, v, gates, beta, saved_inverse, scale: float, grad) -> list[torch.Tensor]:
    """dq, dk, dv, dG (of the cumulative gates), dbeta, fp32, from what the forward kept."""
    length = k.shape[1]
    padded = -(-length // CHUNK) * CHUNK
    # The WY factors and per-chunk states again from what was kept (fla's backward recomputes them
    # too), with the saved A: padded tokens' rows of it are zero, and reach no real token's output
    # (causality), whose gradients alone are propagated.
    chunked = _chunked(
        _chunks(q, padded),
        _chunks(k, padded),
        _chunks(v, padded),
        _chunks(gates, padded, edge=True),
        _chunks(beta, padded),
        _chunks(saved_inverse, padded),
    )
    grads = _delta_rule_grads(chunked, _chunks(grad, padded) * scale)
    return [_unchunk(t, length) for t in grads]


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
        gates = chunk_local_cumsum(g)
        out, saved_inverse = _rule_forward(q, k, v, gates, beta, scale)
        ctx.save_for_backward(q, k, v, gates, beta, saved_inverse)
        ctx.scale = scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        q, k, v, gates, beta, saved_inverse = ctx.saved_tensors
        dq, dk, dv, d_gates, dbeta = _rule_backward(
            q, k, v, gates, beta, saved_inverse, ctx.scale, grad
        )
        dg = chunk_local_cumsum(d_gates, reverse=True)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, dbeta.to(beta.dtype), None


def _interleave_last(t: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, T, H, ...] -> [B, T * steps, H, ...]: each token's values at its last step, zeros before."""
    spread = t.new_zeros(t.shape[0], t.shape[1], steps, *t.shape[2:])
    spread[:, :, -1] = t
    return spread.flatten(1, 2)


class _ChunkGatedDeltaProduct(torch.autograd.Function):
    """The gated delta rule over ``steps`` Householder steps per token (GatedDeltaProduct): k, v
    and beta come interleaved (``[B, T * steps, ...]``), the token's decay applies at its first
    step, and q reads the state after its last."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float,
        steps: int,
    ) -> torch.Tensor:
        g_steps = g.new_zeros(g.shape[0], g.shape[1], steps, g.shape[2], dtype=torch.float32)
        g_steps[:, :, 0] = g
        gates = chunk_local_cumsum(g_steps.flatten(1, 2))
        out, saved_inverse = _rule_forward(_interleave_last(q, steps), k, v, gates, beta, scale)
        # fla's ChunkGatedDeltaProductFunction keeps q (one per token), k, v, the interleaved
        # cumulative gate, beta and A.
        ctx.save_for_backward(q, k, v, gates, beta, saved_inverse)
        ctx.scale, ctx.steps = scale, steps
        return out.unflatten(1, (q.shape[1], steps))[:, :, -1].to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        q, k, v, gates, beta, saved_inverse = ctx.saved_tensors
        steps = ctx.steps
        dq, dk, dv, d_gates, dbeta = _rule_backward(
            _interleave_last(q, steps),
            k,
            v,
            gates,
            beta,
            saved_inverse,
            ctx.scale,
            _interleave_last(grad, steps),
        )
        dq = dq.unflatten(1, (q.shape[1], steps))[:, :, -1]
        dg = chunk_local_cumsum(d_gates, reverse=True).unflatten(1, (q.shape[1], steps))[:, :, 0]
        return (
            dq.to(q.dtype),
            dk.to(k.dtype),
            dv.to(v.dtype),
            dg.contiguous(),
            dbeta.to(beta.dtype),
            None,
            None,
        )


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


def chunk_gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    num_householder: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    **unsupported: Any,
) -> tuple[torch.Tensor, None]:
    """fla's ``chunk_gated_delta_product`` (q ``[B, T, H, K]``, k ``[B, T*n, H, K]``, v
    ``[B, T*n, H, V]``, g ``[B, T, H]``, beta ``[B, T*n, H]``, n = ``num_householder``): ``(o,
    None)``, o ``[B, T, H, V]``."""
    for what, value in (
        ("an initial state", initial_state),
        ("a final state", output_final_state),
        ("the in-kernel l2norm", use_qk_l2norm_in_kernel),
        ("packed sequences (cu_seqlens)", cu_seqlens),
        *unsupported.items(),
    ):
        _refuse(what, value)
    steps = num_householder
    if k.shape[1] != q.shape[1] * steps or q.shape[2] != v.shape[2] or k.shape[2] != v.shape[2]:
        raise NotImplementedError(
            "the CPU gated delta product takes k, v, beta with num_householder steps per token and "
            "as many q/k heads as v heads (MCore repeats them)"
        )
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    return _ChunkGatedDeltaProduct.apply(q, k, v, g, beta, scale, steps), None


# fla's own second name for ``l2norm`` (GatedDeltaProduct imports this one).
l2_norm = l2norm
