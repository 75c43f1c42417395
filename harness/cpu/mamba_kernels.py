"""CPU stand-ins for the CUDA / Triton kernels Megatron Core's Mamba mixer calls.

Megatron Core 0.19.2's ``MambaMixer`` (megatron/core/ssm/mamba_mixer.py) imports its training kernels
from two CUDA packages and leaves the names unbound (``None``, or a ``MagicMock``) when they are
missing, as they are on CPU:

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
what the probe measures as retained is what a GPU run retains. Its backward recomputes the
intermediates it needs from those alone, as the GPU backward kernels recompute the convolution and
the chunk states, and derives the gradients explicitly with grad mode off: a backward that re-ran
autograd would run with grad mode on, which the probe counts as replay (harness.probe.measurement.measure),
and replay is what Megatron Core's checkpoints do, not what a kernel does. No intermediate of the
forward outlives it. The math is the kernels' (fp32 inside, outputs in the input dtype), written
from the Mamba-2 paper's SSD formulation (Dao & Gu, 2024): per chunk, the quadratic masked form
inside the chunk and the state recurrence across chunks. The tests hold forward and gradients
against the sequential recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``,
``y_t = C_t h_t + D x_t`` under autograd.

What Megatron Core's training path never passes (packed sequences' ``seq_idx``, initial or final
states, the kernel-fused RMSNorm / out-projection, ``d_nonssm`` columns) is refused with
``NotImplementedError`` rather than approximated. ``harness.cpu.adapter.bind_mamba_kernels`` binds
these into ``mamba_mixer``'s module globals, on CPU only, where Megatron Core left them unbound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_NO_DT_LIMIT = (0.0, float("inf"))


def _compute(t: torch.Tensor) -> torch.Tensor:
    """The kernels' arithmetic: 16-bit inputs are loaded as fp32."""
    return t.float() if t.element_size() < 4 else t


def _silu_grad(v: torch.Tensor) -> torch.Tensor:
    """d silu(v) / dv = s (1 + v (1 - s)), s = sigmoid(v)."""
    s = torch.sigmoid(v)
    return s * (1 + v * (1 - s))


def _as(grad: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient in its input's dtype; None for an input that is None."""
    return None if grad is None or like is None else grad.to(like.dtype)


def _refuse(what: str, value: Any) -> None:
    if value is not None and value is not False:
        raise NotImplementedError(f"the CPU Mamba stand-ins take no {what}")


# --- causal depthwise convolution -------------------------------------------------------------------


def _conv_pre(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [b, d, l], weight [d, w] -> fp32 [b, d, l]: out_t = bias + sum_k w_k x_{t-w+1+k}."""
    dim, width = weight.shape
    return F.conv1d(
        _compute(x),
        _compute(weight).unsqueeze(1),
        None if bias is None else _compute(bias),
        padding=width - 1,
        groups=dim,
    )[..., : x.shape[-1]]


def _causal_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> torch.Tensor:
    pre = _conv_pre(x, weight, bias)
    return (F.silu(pre) if silu else pre).to(x.dtype)


def _causal_conv_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """fp32 (dx, dweight, dbias) of ``_causal_conv``, its pre-activation recomputed from x."""
    width = weight.shape[1]
    grad = grad_out.float()
    if silu:
        grad = grad * _silu_grad(_conv_pre(x, weight, bias))
    # dx_s = sum_k w_k g_{s+w-1-k}: the same depthwise convolution, anti-causal, weights flipped.
    dx = F.conv1d(
        F.pad(grad, (0, width - 1)), weight.float().flip(-1).unsqueeze(1), groups=weight.shape[0]
    )
    padded, length = F.pad(x.float(), (width - 1, 0)), x.shape[-1]
    dweight = torch.stack(
        [(grad * padded[..., k : k + length]).sum((0, 2)) for k in range(width)], dim=1
    )
    return dx, dweight, None if bias is None else grad.sum((0, 2))


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
        dx, dweight, dbias = _causal_conv_backward(grad_out, x, weight, bias, ctx.silu)
        return _as(dx, x), _as(dweight, weight), _as(dbias, bias), None, None, None, None, None


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


@dataclass
class _ScanGrads:
    """fp32 gradients of the SSD scan's inputs (None where there is no such input)."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None


class _Scan:
    """The SSD scan in fp32: x [b, l, h, p], dt [b, l, h], A [h], B/C [b, l, g, n], D [h] or [h, p],
    z like x. Built, it holds the forward's intermediates (``y``: the scan output + D x;
    ``dA_cumsum``, as the kernel keeps it); ``backward`` derives every input's gradient from them.

    Per chunk of ``chunk_size`` steps (padded steps have dt = 0, as the kernel masks them), with cs
    the within-chunk cumulative sum of dt·A and S_c the state entering chunk c:
    ``y_i = sum_{j<=i} C_i·B_j exp(cs_i - cs_j) dt_j x_j + exp(cs_i) C_i·S_c``,
    ``S_{c+1} = exp(cs_last) S_c + sum_j exp(cs_last - cs_j) dt_j B_j x_j``.
    """

    def __init__(
        self,
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
    ) -> None:
        batch, seqlen, nheads, headdim = x.shape
        self.sizes = (batch, seqlen, nheads, headdim, B.shape[2], B.shape[3])
        self.chunks = math.ceil(seqlen / chunk_size)
        self.pad = self.chunks * chunk_size - seqlen
        self.softplus, self.has_bias = dt_softplus, dt_bias is not None
        self.pre = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
        delta = F.softplus(self.pre) if dt_softplus else self.pre
        self.in_limit = None
        if tuple(dt_limit) != _NO_DT_LIMIT:
            self.in_limit = (delta >= dt_limit[0]) & (delta <= dt_limit[1])
            delta = delta.clamp(dt_limit[0], dt_limit[1])
        self.xf, self.A = x.float(), A.float()
        self.D = None if D is None else D.float()
        self.zf = None if z is None else z.float()
        self.ds = self._chunked(delta).permute(0, 3, 1, 2)  # [b, h, c, q]
        self.xs = self._chunked(self.xf)  # [b, c, q, h, p]
        per_group = nheads // B.shape[2]
        self.Bs = self._chunked(B.float()).repeat_interleave(per_group, dim=3)  # [b, c, q, h, n]
        self.Cs = self._chunked(C.float()).repeat_interleave(per_group, dim=3)
        self.dA_cumsum = (self.ds * self.A[:, None, None]).cumsum(-1)  # [b, h, c, q]
        cs = self.dA_cumsum

        causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
        self.L = torch.exp((cs[..., :, None] - cs[..., None, :]).masked_fill(~causal, -math.inf))
        self.G = torch.einsum("bcihn,bcjhn->bhcij", self.Cs, self.Bs)
        self.M = self.G * self.L * self.ds[..., None, :]  # [b, h, c, i, j]
        y = torch.einsum("bhcij,bcjhp->bcihp", self.M, self.xs)

        self.u = torch.exp(cs[..., -1:] - cs)  # [b, h, c, q]: decay from step j to the chunk's end
        self.w = (self.u * self.ds).permute(0, 2, 3, 1)  # [b, c, q, h]
        chunk_states = torch.einsum("bcjhn,bcjh,bcjhp->bchpn", self.Bs, self.w, self.xs)
        self.decay = torch.exp(cs[..., -1])  # [b, h, c]: decay across a whole chunk
        entering, state = [], torch.zeros_like(chunk_states[:, 0])
        for c in range(self.chunks):
            entering.append(state)
            state = state * self.decay[:, :, c, None, None] + chunk_states[:, c]
        self.states_in = torch.stack(entering, dim=1)  # [b, c, h, p, n]
        self.E = torch.exp(cs).permute(0, 2, 3, 1)  # [b, c, q, h]: decay from the chunk's start
        self.CS = torch.einsum("bcihn,bchpn->bcihp", self.Cs, self.states_in)
        y = self._unchunked(y + self.CS * self.E[..., None])
        self.y = y + self.xf * self._d() if self.D is not None else y

    def _chunked(self, t: torch.Tensor) -> torch.Tensor:  # [b, l, ...] -> [b, c, q, ...]
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, self.pad))
        return t.reshape(t.shape[0], self.chunks, -1, *t.shape[2:])

    def _unchunked(self, t: torch.Tensor) -> torch.Tensor:  # [b, c, q, ...] -> [b, l, ...]
        return t.reshape(t.shape[0], -1, *t.shape[3:])[:, : self.sizes[1]]

    def _d(self) -> torch.Tensor:
        assert self.D is not None
        return self.D[:, None] if self.D.dim() == 1 else self.D

    def outputs(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, out_x) in ``dtype``: out_x = y; out = y·silu(z), or out_x itself without z."""
        out_x = self.y.to(dtype)
        return (out_x if self.zf is None else (self.y * F.silu(self.zf)).to(dtype)), out_x

    def backward(self, grad_out: torch.Tensor) -> _ScanGrads:
        batch, seqlen, nheads, _, ngroups, dstate = self.sizes
        grad = grad_out.float()
        gz = None
        if self.zf is not None:
            gz = grad * self.y * _silu_grad(self.zf)
            grad = grad * F.silu(self.zf)
        gD, gx = None, torch.zeros_like(self.xf)
        if self.D is not None:
            gD = (grad * self.xf).sum((0, 1) if self.D.dim() == 2 else (0, 1, 3))
            gx = grad * self._d()
        gys = self._chunked(grad)  # [b, c, q, h, p]

        # The entering state's term: y_i += E_i C_i·S_c.
        gE = (gys * self.CS).sum(-1)  # [b, c, q, h]
        gyE = gys * self.E[..., None]
        gCs = torch.einsum("bcihp,bchpn->bcihn", gyE, self.states_in)
        g_entering = torch.einsum("bcihp,bcihn->bchpn", gyE, self.Cs)
        # S_{c+1} = decay_c S_c + chunk_state_c, walked backwards.
        g_chunk_states = torch.zeros_like(g_entering)
        g_decay = torch.zeros_like(self.decay)
        running = torch.zeros_like(g_entering[:, 0])  # the gradient of S_{c+1}
        for c in reversed(range(self.chunks)):
            g_chunk_states[:, c] = running
            g_decay[:, :, c] = (running * self.states_in[:, c]).sum((-1, -2))
            running = g_entering[:, c] + running * self.decay[:, :, c, None, None]
        gw = torch.einsum("bchpn,bcjhn,bcjhp->bcjh", g_chunk_states, self.Bs, self.xs)
        gBs = torch.einsum("bchpn,bcjh,bcjhp->bcjhn", g_chunk_states, self.w, self.xs)
        gxs = torch.einsum("bchpn,bcjh,bcjhn->bcjhp", g_chunk_states, self.w, self.Bs)

        # Inside each chunk: y_i += sum_j M_ij x_j, M_ij = G_ij L_ij dt_j.
        gM = torch.einsum("bcihp,bcjhp->bhcij", gys, self.xs)
        gxs = gxs + torch.einsum("bhcij,bcihp->bcjhp", self.M, gys)
        gG = gM * self.L * self.ds[..., None, :]
        g_gap = gM * self.M  # d/d(cs_i - cs_j): M_ij is proportional to exp(cs_i - cs_j)
        g_delta = (gM * self.G * self.L).sum(-2)  # [b, h, c, j]
        gCs = gCs + torch.einsum("bhcij,bcjhn->bcihn", gG, self.Bs)
        gBs = gBs + torch.einsum("bhcij,bcihn->bcjhn", gG, self.Cs)

        # Everything that reads the cumulative sum, then the sum itself (a reversed cumsum).
        gw_h = gw.permute(0, 3, 1, 2)  # [b, h, c, q]
        g_delta = g_delta + gw_h * self.u
        to_end = gw_h * self.u * self.ds
        g_cs = g_gap.sum(-1) - g_gap.sum(-2) - to_end + (gE * self.E).permute(0, 3, 1, 2)
        g_cs[..., -1] += to_end.sum(-1) + g_decay * self.decay
        g_dA = g_cs.flip(-1).cumsum(-1).flip(-1)
        g_delta = g_delta + g_dA * self.A[:, None, None]
        gA = (g_dA * self.ds).sum((0, 2, 3))

        g_pre = self._unchunked(g_delta.permute(0, 2, 3, 1))
        if self.in_limit is not None:
            g_pre = g_pre * self.in_limit
        if self.softplus:
            g_pre = g_pre * torch.sigmoid(self.pre)
        per_group = (batch, seqlen, ngroups, nheads // ngroups, dstate)
        return _ScanGrads(
            x=gx + self._unchunked(gxs),
            dt=g_pre,
            A=gA,
            B=self._unchunked(gBs).reshape(per_group).sum(3),
            C=self._unchunked(gCs).reshape(per_group).sum(3),
            D=gD,
            z=gz,
            dt_bias=g_pre.sum((0, 1)) if self.has_bias else None,
        )


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
        scan = _Scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, dt_limit)
        out, out_x = scan.outputs(x.dtype)
        ctx.save_for_backward(
            out if z is None else out_x,
            x,
            dt,
            scan.dA_cumsum,
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
        g = _Scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, dt_limit).backward(
            grad_out
        )
        return (
            _as(g.x, x),
            _as(g.dt, dt),
            _as(g.A, A),
            _as(g.B, B),
            _as(g.C, C),
            None,
            _as(g.D, D),
            _as(g.z, z),
            _as(g.dt_bias, dt_bias),
            *([None] * 7),
        )


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


# --- split + convolution + scan in one (the training path) ------------------------------------------


@dataclass(frozen=True)
class _SplitShape:
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    silu: bool
    chunk_size: int
    dt_limit: tuple[float, float]

    @property
    def dim(self) -> int:
        return self.nheads * self.headdim

    def split(self, zxbcdt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """zxbcdt [b, l, ·] -> z [b, l, dim], xBC [b, l, dim + 2 g n], dt [b, l, h]."""
        return torch.split(
            zxbcdt, [self.dim, self.dim + 2 * self.ngroups * self.dstate, self.nheads], dim=-1
        )

    def scan(
        self,
        zxbcdt: torch.Tensor,
        conv1d_weight: torch.Tensor,
        conv1d_bias: torch.Tensor | None,
        dt_bias: torch.Tensor,
        A: torch.Tensor,
        D: torch.Tensor,
    ) -> _Scan:
        """The convolution (in zxbcdt's dtype, as the kernel writes it), then the scan over it."""
        batch, seqlen, _ = zxbcdt.shape
        z, xBC, dt = self.split(zxbcdt)
        xBC = _causal_conv(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, self.silu)
        group = self.ngroups * self.dstate
        x, B, C = torch.split(xBC.transpose(1, 2), [self.dim, group, group], dim=-1)
        return _Scan(
            x.reshape(batch, seqlen, self.nheads, self.headdim),
            dt,
            A,
            B.reshape(batch, seqlen, self.ngroups, self.dstate),
            C.reshape(batch, seqlen, self.ngroups, self.dstate),
            self.chunk_size,
            D,
            z.reshape(batch, seqlen, self.nheads, self.headdim),
            dt_bias,
            True,
            self.dt_limit,
        )


class MambaSplitConv1dScanCombinedFn(torch.autograd.Function):
    """mamba-ssm's ``MambaSplitConv1dScanCombinedFn``: saves ``(zxbcdt, conv1d_weight, conv1d_bias,
    out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight,
    outproj_bias)``; on Megatron Core's call (no states, no fused RMSNorm or out-projection) the last
    six are ``None`` and ``out_x`` is the ungated scan output [b, l, h, p]."""

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
                raise ValueError("headdim is required when D holds one value per head")
            nheads = D.shape[0]
        else:
            nheads, headdim = D.shape
        dstate = (conv1d_weight.shape[0] - nheads * headdim) // ngroups // 2
        if zxbcdt.shape[-1] != 2 * nheads * headdim + 2 * ngroups * dstate + nheads:
            raise NotImplementedError(
                "the CPU Mamba stand-ins take no d_nonssm columns (zxbcdt wider than z, xBC, dt)"
            )
        shape = _SplitShape(
            nheads,
            headdim,
            ngroups,
            dstate,
            activation in ("silu", "swish"),
            chunk_size,
            dt_limit,
        )
        out, out_x = shape.scan(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D).outputs(
            zxbcdt.dtype
        )
        rstd = None  # the fused RMSNorm's statistics: there is no fused RMSNorm here
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
        ctx.shape = shape
        return out.reshape(*zxbcdt.shape[:2], shape.dim)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        zxbcdt, conv1d_weight, conv1d_bias, _, A, D, dt_bias, *_ = ctx.saved_tensors
        shape: _SplitShape = ctx.shape
        batch, seqlen, _ = zxbcdt.shape
        scan = shape.scan(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D)
        g = scan.backward(grad_out.reshape(batch, seqlen, shape.nheads, shape.headdim))
        g_xbc_out = torch.cat([g.x.flatten(2), g.B.flatten(2), g.C.flatten(2)], dim=-1).transpose(
            1, 2
        )
        xBC = shape.split(zxbcdt)[1].transpose(1, 2)
        g_xbc, g_weight, g_bias = _causal_conv_backward(
            g_xbc_out, xBC, conv1d_weight, conv1d_bias, shape.silu
        )
        assert g.z is not None and g.dt_bias is not None
        g_zxbcdt = torch.cat([g.z.flatten(2), g_xbc.transpose(1, 2), g.dt], dim=-1)
        return (
            _as(g_zxbcdt, zxbcdt),
            _as(g_weight, conv1d_weight),
            _as(g_bias, conv1d_bias),
            _as(g.dt_bias, dt_bias),
            _as(g.A, A),
            _as(g.D, D),
            *([None] * 13),
        )


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


def _rstd(gated: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    """fp32 [M, groups]: 1 / sqrt(mean of squares + eps) per row and group."""
    rows, width = gated.shape
    return torch.rsqrt(gated.reshape(rows, width // group, group).square().mean(-1) + eps)


class GatedRMSNormFn(torch.autograd.Function):
    """mamba-ssm's ``LayerNormFn`` as an RMSNorm: saves ``(x, weight, bias, mean, rstd, z)``, x and z
    as [M, N] (views of the inputs when those are contiguous), mean ``None``, rstd fp32 [groups·M]
    group-major, as the kernel writes it. ``norm(x)·silu(z)`` if ``norm_before_gate``, else
    ``norm(x·silu(z))``."""

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
        gated = x.float() if z is None or norm_before_gate else x.float() * F.silu(z.float())
        rstd = _rstd(gated, group, eps)
        y = _GroupNorm(gated, rstd, group).normed * weight.float()
        if bias is not None:
            y = y + bias.float()
        if z is not None and norm_before_gate:
            y = y * F.silu(z.float())
        ctx.save_for_backward(x, weight, bias, None, rstd.t().reshape(-1), z)
        ctx.norm = (shape, group, norm_before_gate)
        return y.to(x.dtype).reshape(shape)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):
        x, weight, bias, _, rstd_saved, z = ctx.saved_tensors
        shape, group, norm_before_gate = ctx.norm
        rows = x.shape[0]
        grad = grad_y.reshape(rows, -1).float()
        zf = None if z is None else z.float()
        gated = x.float() if zf is None or norm_before_gate else x.float() * F.silu(zf)
        norm = _GroupNorm(gated, rstd_saved.reshape(-1, rows).t(), group)
        dz = None
        if zf is not None and norm_before_gate:
            affine = norm.normed * weight.float() + (0 if bias is None else bias.float())
            dz = grad * affine * _silu_grad(zf)
            grad = grad * F.silu(zf)
        dweight = (grad * norm.normed).sum(0)
        dbias = grad.sum(0) if bias is not None else None
        d_gated = norm.backward(grad * weight.float())
        if zf is not None and not norm_before_gate:
            dz = d_gated * x.float() * _silu_grad(zf)
            d_gated = d_gated * F.silu(zf)
        return (
            d_gated.to(x.dtype).reshape(shape),
            _as(dweight, weight),
            _as(dbias, bias),
            None if dz is None or z is None else dz.to(z.dtype).reshape(shape),
            None,
            None,
            None,
        )


class _GroupNorm:
    """x̂ = v · rstd per row and group of ``group`` columns, and its input gradient."""

    def __init__(self, v: torch.Tensor, rstd: torch.Tensor, group: int) -> None:
        self.rows, self.width, self.group = v.shape[0], v.shape[1], group
        self.rstd = rstd[..., None]  # [M, groups, 1]
        self.hat = v.reshape(self.rows, -1, group) * self.rstd
        self.normed = self.hat.reshape(self.rows, self.width)

    def backward(self, grad_hat: torch.Tensor) -> torch.Tensor:
        g = grad_hat.reshape(self.rows, -1, self.group)
        dv = self.rstd * (g - self.hat * (g * self.hat).mean(-1, keepdim=True))
        return dv.reshape(self.rows, self.width)


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
