"""CPU stand-ins for the CUDA / Triton kernels Megatron Core's Mamba mixer calls.

Megatron Core 0.19.2's ``MambaMixer`` (megatron/core/ssm/mamba_mixer.py) imports its training kernels
from two CUDA packages and leaves the names unbound (``None``, or a ``MagicMock`` base class) when they
are missing, as they are on CPU:

- ``causal_conv1d_fn`` (causal-conv1d 1.7.0, ``CausalConv1dFn``): the depthwise causal convolution of
  the non-memory-efficient path (and of the Gated DeltaNet stand-ins);
- ``mamba_chunk_scan_combined`` (mamba-ssm 2.3.2, ``MambaChunkScanCombinedFn``): the SSD chunked
  scan of the non-memory-efficient path;
- ``mamba_split_conv1d_scan_combined`` (``MambaSplitConv1dScanCombinedFn``): split of ``zxBCdt``,
  convolution, SSD scan and the ``silu(z)`` gate in one kernel, the training path
  (``use_mamba_mem_eff_path``, on by default);
- ``RMSNormGated`` (``mamba_ssm.ops.triton.layernorm_gated.RMSNorm``, ``LayerNormFn``): the mixer's
  grouped, optionally gated RMSNorm.

Each is a ``torch.autograd.Function`` whose forward saves exactly the tensors the GPU kernel's
autograd function saves (the same tensors, shapes and dtypes, ``None`` where it saves ``None``), so
what a probe measures as retained is what a GPU run retains; its backward recomputes from those
alone (autograd over the same formulation, on detached copies of the saved inputs), as the GPU
backward kernels recompute the convolution and the chunk states. No intermediate of the forward
outlives it. The math is the kernels' (fp32 inside, outputs in the input dtype), written from the
Mamba-2 paper's SSD formulation (Dao & Gu, 2024): per chunk, the quadratic masked form inside the
chunk and the state recurrence across chunks. The tests hold it against the sequential recurrence
``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t h_t + D x_t``.

What Megatron Core's training path never passes (packed sequences' ``seq_idx``, initial or final
states, the kernel-fused RMSNorm / out-projection, ``d_nonssm`` columns) is refused with
``NotImplementedError`` rather than approximated. ``harness.cpu.adapter.bind_mamba_kernels`` binds
these into ``mamba_mixer``'s module globals, on CPU only, where Megatron Core left them unbound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

_NO_DT_LIMIT = (0.0, float("inf"))


def _compute(t: torch.Tensor) -> torch.Tensor:
    """The kernels' arithmetic: 16-bit inputs are loaded as fp32."""
    return t.float() if t.element_size() < 4 else t


def _grads_by_recompute(
    ctx: Any,
    forward: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor | None],
    grad_outputs: Sequence[torch.Tensor | None],
) -> list[torch.Tensor | None]:
    """Gradients of ``forward(*inputs)`` for the inputs ``ctx.needs_input_grad`` asks for.

    ``inputs`` are the saved tensors (in the Function's argument order); they are detached, so the
    recomputed graph lives only inside this backward.
    """
    leaves = [
        None
        if t is None
        else t.detach().requires_grad_(bool(ctx.needs_input_grad[i]) and t.is_floating_point())
        for i, t in enumerate(inputs)
    ]
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    result: list[torch.Tensor | None] = [None] * len(leaves)
    if not wanted:
        return result
    with torch.enable_grad():
        outputs = forward(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs, strict=True) if g is not None]
    grads = torch.autograd.grad(
        [o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True
    )
    by_leaf = dict(zip(map(id, wanted), grads, strict=True))
    for i, leaf in enumerate(leaves):
        if leaf is not None and id(leaf) in by_leaf:
            grad = by_leaf[id(leaf)]
            result[i] = torch.zeros_like(leaf) if grad is None else grad
    return result


# --- causal depthwise convolution -------------------------------------------------------------------


def _causal_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> torch.Tensor:
    """x [b, d, l], weight [d, w] -> [b, d, l] in x's dtype: out_t = sum_k w_k x_{t-w+1+k} (+ bias)."""
    dim, width = weight.shape
    out = F.conv1d(
        _compute(x),
        _compute(weight).unsqueeze(1),
        None if bias is None else _compute(bias),
        padding=width - 1,
        groups=dim,
    )[..., : x.shape[-1]]
    return (F.silu(out) if silu else out).to(x.dtype)


def _refuse(what: str, value: Any) -> None:
    if value is not None and value is not False:
        raise NotImplementedError(f"the CPU Mamba stand-ins take no {what}")


class CausalConv1dFn(torch.autograd.Function):
    """causal-conv1d's ``CausalConv1dFn``: saves ``(x, weight, bias, seq_idx, initial_states)``."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        seq_idx: torch.Tensor | None,
        initial_states: torch.Tensor | None,
        return_final_states: bool,
        final_states_out: torch.Tensor | None,
        activation: str | None,
    ) -> torch.Tensor:
        if activation not in (None, "silu", "swish"):
            raise NotImplementedError("activation must be None, silu, or swish")
        _refuse("seq_idx", seq_idx)
        _refuse("initial_states", initial_states)
        _refuse("final states", return_final_states)
        # The kernel takes channel-first or channel-last x and copies anything else; the copy is
        # what it saves.
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        bias = bias.contiguous() if bias is not None else None
        ctx.silu = activation in ("silu", "swish")
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        return _causal_conv(x, weight, bias, ctx.silu)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        x, weight, bias, _, _ = ctx.saved_tensors
        dx, dweight, dbias = _grads_by_recompute(
            ctx, lambda x, w, b: _causal_conv(x, w, b, ctx.silu), (x, weight, bias), (grad_out,)
        )
        return dx, dweight, dbias, None, None, None, None, None


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """causal-conv1d's ``causal_conv1d_fn``: x [b, d, l], weight [d, w], bias [d] -> [b, d, l]."""
    return CausalConv1dFn.apply(
        x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, activation
    )


# --- SSD (Mamba-2) chunked scan ---------------------------------------------------------------------


def _ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The SSD scan: x [b, l, h, p], dt [b, l, h], A [h], B/C [b, l, g, n], D [h] or [h, p], z like x.

    Returns ``(out, out_x, dA_cumsum)``: ``out_x`` the scan's output ``y`` (+ D x), ``out`` that
    gated by ``silu(z)`` (``out_x`` itself when z is None), both in x's dtype; ``dA_cumsum`` the fp32
    within-chunk cumulative sum of ``dt·A``, [b, h, chunks, chunk_size], as the kernel keeps it.
    """
    batch, seqlen, nheads, _ = x.shape
    ngroups = B.shape[2]
    chunks = math.ceil(seqlen / chunk_size)
    pad = chunks * chunk_size - seqlen
    delta = _compute(dt).float()
    if dt_bias is not None:
        delta = delta + dt_bias.float()
    if dt_softplus:
        delta = F.softplus(delta)
    if tuple(dt_limit) != _NO_DT_LIMIT:
        delta = delta.clamp(dt_limit[0], dt_limit[1])

    def chunked(t: torch.Tensor) -> torch.Tensor:  # [b, l, ...] -> [b, c, q, ...], zero-padded
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(batch, chunks, chunk_size, *t.shape[2:])

    # Padded steps have dt = 0: no decay, no input, as the kernel masks them.
    xs = chunked(x.float())
    ds = chunked(delta)  # [b, c, q, h]
    heads_per_group = nheads // ngroups
    Bs = chunked(B.float()).repeat_interleave(heads_per_group, dim=3)  # [b, c, q, h, n]
    Cs = chunked(C.float()).repeat_interleave(heads_per_group, dim=3)
    dA_cumsum = (ds * A.float()).permute(0, 3, 1, 2).cumsum(-1)  # [b, h, c, q]

    # Inside a chunk: y_i = sum_{j<=i} C_i·B_j exp(cs_i - cs_j) dt_j x_j.
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    gaps = dA_cumsum[..., :, None] - dA_cumsum[..., None, :]  # [b, h, c, i, j]
    decay = torch.exp(gaps.masked_fill(~causal, float("-inf")))
    scores = (
        torch.einsum("bcihn,bcjhn->bhcij", Cs, Bs) * decay * ds.permute(0, 3, 1, 2)[..., None, :]
    )
    y = torch.einsum("bhcij,bcjhp->bcihp", scores, xs)

    # Across chunks: each chunk's final state, then the state entering each chunk.
    to_end = torch.exp(dA_cumsum[..., -1:] - dA_cumsum)  # [b, h, c, q]
    weights = (to_end * ds.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # [b, c, q, h]
    chunk_states = torch.einsum("bcjhn,bcjh,bcjhp->bchpn", Bs, weights, xs)
    entering = []
    state = torch.zeros_like(chunk_states[:, 0])
    for c in range(chunks):
        entering.append(state)
        state = state * torch.exp(dA_cumsum[:, :, c, -1])[..., None, None] + chunk_states[:, c]
    states_in = torch.stack(entering, dim=1)  # [b, c, h, p, n]
    from_start = torch.exp(dA_cumsum).permute(0, 2, 3, 1)  # [b, c, q, h]
    y = y + torch.einsum("bcihn,bchpn,bcih->bcihp", Cs, states_in, from_start)

    y = y.reshape(batch, chunks * chunk_size, *y.shape[3:])[:, :seqlen]
    if D is not None:
        Df = D.float()
        y = y + x.float() * (Df[:, None] if Df.dim() == 1 else Df)
    out_x = y.to(x.dtype)
    out = out_x if z is None else (y * F.silu(z.float())).to(x.dtype)
    return out, out_x, dA_cumsum


class MambaChunkScanCombinedFn(torch.autograd.Function):
    """mamba-ssm's ``MambaChunkScanCombinedFn``: saves ``(out if z is None else out_x, x, dt,
    dA_cumsum, A, B, C, D, z, dt_bias, initial_states, seq_idx)``."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        chunk_size: int,
        D: torch.Tensor | None,
        z: torch.Tensor | None,
        dt_bias: torch.Tensor | None,
        initial_states: torch.Tensor | None,
        seq_idx: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
        dt_softplus: bool,
        dt_limit: tuple[float, float],
        return_final_states: bool,
        return_varlen_states: bool,
    ) -> torch.Tensor:
        for what, value in (
            ("initial_states", initial_states),
            ("seq_idx", seq_idx),
            ("final states", return_final_states),
            ("varlen states", return_varlen_states),
        ):
            _refuse(what, value)
        # The kernel makes these contiguous where their last stride is not 1 (and keeps the copies).
        B = B if B.stride(-1) == 1 else B.contiguous()
        C = C if C.stride(-1) == 1 else C.contiguous()
        out, out_x, dA_cumsum = _ssd(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, dt_limit
        )
        ctx.save_for_backward(
            out if z is None else out_x,
            x,
            dt,
            dA_cumsum,
            A,
            B,
            C,
            D,
            z,
            dt_bias,
            initial_states,
            seq_idx,
        )
        ctx.scan = (chunk_size, dt_softplus, dt_limit)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        _, x, dt, _, A, B, C, D, z, dt_bias, _, _ = ctx.saved_tensors
        chunk_size, dt_softplus, dt_limit = ctx.scan

        def forward(x, dt, A, B, C, D, z, dt_bias):
            return _ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, dt_limit)[0]

        # Gradients in needs_input_grad order: map the Function's argument slots onto forward's.
        slots = (0, 1, 2, 3, 4, 6, 7, 8)
        grads = _grads_by_recompute(
            _Slots(ctx, slots), forward, (x, dt, A, B, C, D, z, dt_bias), (grad_out,)
        )
        dx, ddt, dA, dB, dC, dD, dz, ddt_bias = grads
        return dx, ddt, dA, dB, dC, None, dD, dz, ddt_bias, *([None] * 7)


class _Slots:
    """``ctx.needs_input_grad`` seen through a subset of the Function's arguments."""

    def __init__(self, ctx: Any, slots: Sequence[int]) -> None:
        self.needs_input_grad = tuple(ctx.needs_input_grad[i] for i in slots)


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = _NO_DT_LIMIT,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> torch.Tensor:
    """mamba-ssm's ``mamba_chunk_scan_combined``: x [b, l, h, p] ... -> out [b, l, h, p]."""
    return MambaChunkScanCombinedFn.apply(
        x,
        dt,
        A,
        B,
        C,
        chunk_size,
        D,
        z,
        dt_bias,
        initial_states,
        seq_idx,
        cu_seqlens,
        dt_softplus,
        dt_limit,
        return_final_states,
        return_varlen_states,
    )


def _split_conv_scan(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    shape: tuple[int, int, int, int, bool, int, tuple[float, float]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """zxbcdt [b, l, 2·dim + 2·g·n + h] -> (out [b, l, dim] gated by silu(z), out_x [b, l, h, p])."""
    nheads, headdim, ngroups, dstate, silu, chunk_size, dt_limit = shape
    dim = nheads * headdim
    batch, seqlen, _ = zxbcdt.shape
    z, xBC, dt = torch.split(zxbcdt, [dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    xBC = _causal_conv(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, silu).transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    out, out_x, _ = _ssd(
        x.reshape(batch, seqlen, nheads, headdim),
        dt,
        A,
        B.reshape(batch, seqlen, ngroups, dstate),
        C.reshape(batch, seqlen, ngroups, dstate),
        chunk_size,
        D,
        z.reshape(batch, seqlen, nheads, headdim),
        dt_bias,
        True,
        dt_limit,
    )
    return out.reshape(batch, seqlen, dim), out_x


class MambaSplitConv1dScanCombinedFn(torch.autograd.Function):
    """mamba-ssm's ``MambaSplitConv1dScanCombinedFn``: saves ``(zxbcdt, conv1d_weight, conv1d_bias,
    out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight,
    outproj_bias)``; without the fused RMSNorm and out-projection (Megatron Core's call) the last four
    and the states are ``None``, and ``out_x`` is the ungated scan output [b, l, h, p]."""

    @staticmethod
    def forward(
        ctx: Any,
        zxbcdt: torch.Tensor,
        conv1d_weight: torch.Tensor,
        conv1d_bias: torch.Tensor | None,
        dt_bias: torch.Tensor,
        A: torch.Tensor,
        D: torch.Tensor,
        chunk_size: int,
        initial_states: torch.Tensor | None,
        seq_idx: torch.Tensor | None,
        dt_limit: tuple[float, float],
        return_final_states: bool,
        activation: str | None,
        rmsnorm_weight: torch.Tensor | None,
        rmsnorm_eps: float,
        outproj_weight: torch.Tensor | None,
        outproj_bias: torch.Tensor | None,
        headdim: int | None,
        ngroups: int,
        norm_before_gate: bool,
    ) -> torch.Tensor:
        if activation not in (None, "silu", "swish"):
            raise NotImplementedError("activation must be None, silu, or swish")
        for what, value in (
            ("initial_states", initial_states),
            ("seq_idx", seq_idx),
            ("final states", return_final_states),
            ("fused RMSNorm (rmsnorm_weight)", rmsnorm_weight),
            ("fused out-projection (outproj_weight)", outproj_weight),
            ("fused out-projection bias", outproj_bias),
        ):
            _refuse(what, value)
        if D.dim() == 1:
            if headdim is None:
                raise ValueError("headdim is required when D is one value per head")
            nheads = D.shape[0]
        else:
            nheads, headdim = D.shape
        dim = nheads * headdim
        dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
        if zxbcdt.shape[-1] != 2 * dim + 2 * ngroups * dstate + nheads:
            raise NotImplementedError(
                "the CPU Mamba stand-ins take no d_nonssm columns (zxbcdt wider than z, xBC, dt)"
            )
        ctx.shape = (
            nheads,
            headdim,
            ngroups,
            dstate,
            activation in ("silu", "swish"),
            chunk_size,
            dt_limit,
        )
        out, out_x = _split_conv_scan(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, ctx.shape)
        rstd = None  # the fused RMSNorm's statistics: no fused RMSNorm here (refused above)
        ctx.save_for_backward(
            zxbcdt,
            conv1d_weight,
            conv1d_bias,
            out_x,
            A,
            D,
            dt_bias,
            initial_states,
            seq_idx,
            rmsnorm_weight,
            rstd,
            outproj_weight,
            outproj_bias,
        )
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        zxbcdt, conv1d_weight, conv1d_bias, _, A, D, dt_bias, *_ = ctx.saved_tensors

        def forward(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D):
            return _split_conv_scan(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, ctx.shape)[0]

        grads = _grads_by_recompute(
            ctx, forward, (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D), (grad_out,)
        )
        return (*grads, *([None] * 13))


def mamba_split_conv1d_scan_combined(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = _NO_DT_LIMIT,
    return_final_states: bool = False,
    activation: str | None = "silu",
    rmsnorm_weight: torch.Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None,
    outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """mamba-ssm's ``mamba_split_conv1d_scan_combined`` (Megatron Core's training path)."""
    return MambaSplitConv1dScanCombinedFn.apply(
        zxbcdt,
        conv1d_weight,
        conv1d_bias,
        dt_bias,
        A,
        D,
        chunk_size,
        initial_states,
        seq_idx,
        dt_limit,
        return_final_states,
        activation,
        rmsnorm_weight,
        rmsnorm_eps,
        outproj_weight,
        outproj_bias,
        headdim,
        ngroups,
        norm_before_gate,
    )


# --- gated, grouped RMSNorm -------------------------------------------------------------------------


def _gated_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None,
    eps: float,
    group_size: int,
    norm_before_gate: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, z [M, N] -> (y [M, N] in x's dtype, rstd [groups·M] fp32, group-major as the kernel
    writes it). ``norm(x)·silu(z)`` if ``norm_before_gate``, else ``norm(x·silu(z))``."""
    rows, width = x.shape
    xf = x.float()
    if z is not None and not norm_before_gate:
        xf = xf * F.silu(z.float())
    grouped = xf.reshape(rows, width // group_size, group_size)
    rstd = torch.rsqrt(grouped.square().mean(-1) + eps)  # [M, groups]
    y = (grouped * rstd[..., None]).reshape(rows, width) * weight.float()
    if bias is not None:
        y = y + bias.float()
    if z is not None and norm_before_gate:
        y = y * F.silu(z.float())
    return y.to(x.dtype), rstd.t().reshape(-1)


class GatedRMSNormFn(torch.autograd.Function):
    """mamba-ssm's ``LayerNormFn`` as an RMSNorm: saves ``(x, weight, bias, mean, rstd, z)`` with x
    and z as [M, N] (views of the inputs when those are contiguous), mean ``None``, rstd fp32
    [groups·M]."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        z: torch.Tensor | None,
        eps: float,
        group_size: int | None,
        norm_before_gate: bool,
    ) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        x = x if x.stride(-1) == 1 else x.contiguous()
        if z is not None:
            if z.shape != shape:
                raise ValueError(f"z has shape {tuple(z.shape)}, x {tuple(shape)}")
            z = z.reshape(-1, shape[-1])
            z = z if z.stride(-1) == 1 else z.contiguous()
        group = shape[-1] if group_size is None else group_size
        if shape[-1] % group:
            raise ValueError(f"group_size {group} does not divide the width {shape[-1]}")
        weight = weight.contiguous()
        bias = bias.contiguous() if bias is not None else None
        y, rstd = _gated_rms_norm(x, weight, bias, z, eps, group, norm_before_gate)
        ctx.save_for_backward(x, weight, bias, None, rstd, z)
        ctx.norm = (shape, eps, group, norm_before_gate)
        return y.reshape(shape)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):
        x, weight, bias, _, _, z = ctx.saved_tensors
        shape, eps, group, norm_before_gate = ctx.norm

        def forward(x, weight, bias, z):
            return _gated_rms_norm(x, weight, bias, z, eps, group, norm_before_gate)[0]

        dx, dweight, dbias, dz = _grads_by_recompute(
            ctx, forward, (x, weight, bias, z), (grad_y.reshape(-1, shape[-1]),)
        )
        return (
            None if dx is None else dx.reshape(shape),
            dweight,
            dbias,
            None if dz is None else dz.reshape(shape),
            None,
            None,
            None,
        )


def rmsnorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """mamba-ssm's ``rmsnorm_fn`` (layernorm_gated)."""
    return GatedRMSNormFn.apply(x, weight, bias, z, eps, group_size, norm_before_gate)


class RMSNormGated(torch.nn.Module):
    """mamba-ssm's ``layernorm_gated.RMSNorm``: same constructor, parameters and ``forward(x, z)``."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return rmsnorm_fn(
            x, self.weight, self.bias, z, self.eps, self.group_size, self.norm_before_gate
        )
