"""The CPU stand-ins for the Mamba kernels: forward and gradients against torch formulations written
here from the papers (the sequential SSM recurrence; a plain causal convolution; RMSNorm), and the
saved-tensor discipline of the GPU kernels' autograd functions.

causal-conv1d and mamba-ssm are not installed to compare with their own torch references: importing
them binds their Triton kernels into Megatron Core's mixer (HAVE_MAMBA_SSM becomes True), which
changes the whole venv's Megatron Core, and their modules import the CUDA extensions at import time.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from harness.cpu import mamba_kernels as mk


def _recurrence(x, dt, A, B, C, D, z, dt_bias):
    """Mamba-2's SSM, step by step: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t,
    then y·silu(z); dt = softplus(dt + dt_bias). x [b, l, h, p], B/C [b, l, g, n]."""
    batch, seqlen, nheads, headdim = x.shape
    groups, dstate = B.shape[2], B.shape[3]
    B = B.float().repeat_interleave(nheads // groups, dim=2)
    C = C.float().repeat_interleave(nheads // groups, dim=2)
    delta = F.softplus(dt.float() + dt_bias.float())
    h = torch.zeros(batch, nheads, headdim, dstate)
    ys = []
    for t in range(seqlen):
        decay = torch.exp(delta[:, t] * A.float())[..., None, None]
        h = (
            h * decay
            + (delta[:, t, :, None, None] * x[:, t, :, :, None].float()) * B[:, t, :, None]
        )
        ys.append(torch.einsum("bhpn,bhn->bhp", h, C[:, t]) + D.float()[:, None] * x[:, t].float())
    y = torch.stack(ys, dim=1)
    return (y * F.silu(z.float())).to(x.dtype)


def _conv_reference(x, weight, bias):
    """out_t = silu(bias + sum_k weight_k x_{t-(w-1)+k}), zeros before the start. x [b, d, l]."""
    width = weight.shape[1]
    padded = F.pad(x.float(), (width - 1, 0))
    out = sum(weight[:, k, None].float() * padded[..., k : k + x.shape[-1]] for k in range(width))
    return F.silu(out + bias.float()[:, None]).to(x.dtype)


def _rms_reference(x, weight, z, group):
    xg = (x.float() * F.silu(z.float())).unflatten(-1, (-1, group))
    y = (xg / torch.sqrt(xg.square().mean(-1, keepdim=True) + 1e-5)).flatten(-2) * weight.float()
    return y.to(x.dtype)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]


def _compare(stand_in, reference, inputs, tol):
    """Max |Δ| / max |reference| of the output and every gradient, under one upstream gradient."""
    a, b = _leaves(*inputs), _leaves(*inputs)
    out_a, out_b = stand_in(*a), reference(*b)
    grad = torch.randn_like(out_a, dtype=torch.float32).to(out_a.dtype)
    out_a.backward(grad)
    out_b.backward(grad)
    pairs = [(out_a, out_b)] + [(p.grad, q.grad) for p, q in zip(a, b) if q.grad is not None]
    assert all(p is not None for p, _ in pairs)
    errors = [
        ((p.float() - q.float()).abs().max() / q.float().abs().max()).item() for p, q in pairs
    ]
    assert max(errors) < tol, errors
    return errors


def _ssm_inputs(batch=2, seqlen=40, nheads=4, headdim=8, groups=2, dstate=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)
    return (
        r(batch, seqlen, nheads, headdim).to(dtype),
        r(batch, seqlen, nheads).to(dtype),
        -torch.exp(r(nheads) * 0.5),
        r(batch, seqlen, groups, dstate).to(dtype),
        r(batch, seqlen, groups, dstate).to(dtype),
        r(nheads),
        r(batch, seqlen, nheads, headdim).to(dtype),
        r(nheads),
    )


@pytest.mark.parametrize("chunk_size", [8, 16, 128])  # several chunks, a ragged last one, one chunk
def test_chunk_scan_matches_the_recurrence(chunk_size):
    def stand_in(x, dt, A, B, C, D, z, dt_bias):
        return mk.mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=True
        )

    _compare(stand_in, _recurrence, _ssm_inputs(), tol=1e-4)


def test_split_conv_scan_matches_conv_then_recurrence():
    batch, seqlen, nheads, headdim, groups, dstate = 2, 24, 4, 8, 2, 16
    dim, conv_dim = nheads * headdim, nheads * headdim + 2 * groups * dstate
    g = torch.Generator().manual_seed(1)
    zxbcdt = torch.randn(batch, seqlen, dim + conv_dim + nheads, generator=g)
    weight, bias = torch.randn(conv_dim, 4, generator=g) * 0.5, torch.randn(conv_dim, generator=g)
    dt_bias, A, D = (
        torch.randn(nheads, generator=g),
        -torch.rand(nheads, generator=g) - 0.5,
        torch.randn(nheads, generator=g),
    )

    def stand_in(zxbcdt, weight, bias, dt_bias, A, D):
        return mk.mamba_split_conv1d_scan_combined(
            zxbcdt,
            weight,
            bias,
            dt_bias,
            A,
            D,
            8,
            headdim=headdim,
            ngroups=groups,
            norm_before_gate=False,
        )

    def reference(zxbcdt, weight, bias, dt_bias, A, D):
        z, xBC, dt = torch.split(zxbcdt, [dim, conv_dim, nheads], dim=-1)
        xBC = _conv_reference(xBC.transpose(1, 2), weight, bias).transpose(1, 2)
        x, B, C = torch.split(xBC, [dim, groups * dstate, groups * dstate], dim=-1)
        y = _recurrence(
            x.unflatten(-1, (nheads, headdim)),
            dt,
            A,
            B.unflatten(-1, (groups, dstate)),
            C.unflatten(-1, (groups, dstate)),
            D,
            z.unflatten(-1, (nheads, headdim)),
            dt_bias,
        )
        return y.flatten(-2)

    _compare(stand_in, reference, (zxbcdt, weight, bias, dt_bias, A, D), tol=1e-4)


def test_causal_conv1d_matches_the_convolution():
    g = torch.Generator().manual_seed(2)
    x, weight, bias = (
        torch.randn(2, 12, 20, generator=g),
        torch.randn(12, 4, generator=g),
        torch.randn(12, generator=g),
    )
    stand_in = lambda x, w, b: mk.causal_conv1d_fn(x, w, b, activation="silu")
    _compare(stand_in, _conv_reference, (x, weight, bias), tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_matches_norm_of_the_gated_input(dtype):
    g = torch.Generator().manual_seed(3)
    x, z = (torch.randn(3, 5, 32, generator=g).to(dtype) for _ in range(2))
    weight = torch.rand(32, generator=g).to(dtype) + 0.5
    stand_in = lambda x, w, z: mk.rmsnorm_fn(x, w, None, z, 1e-5, 8, False)
    reference = lambda x, w, z: _rms_reference(x, w, z, 8)
    _compare(stand_in, reference, (x, weight, z), tol=1e-5 if dtype == torch.float32 else 0.07)


def _saved(fn, *args):
    """The output of ``fn(*args)`` and the slots its Function saved for backward: (shape, dtype) or
    None, and the tensors themselves."""
    out = fn(*args)
    saved = out.grad_fn.saved_tensors
    return out, [None if t is None else (tuple(t.shape), t.dtype) for t in saved], saved


def test_chunk_scan_saves_what_the_gpu_kernel_saves():
    x, dt, A, B, C, D, z, dt_bias = _leaves(*_ssm_inputs(seqlen=20, dtype=torch.bfloat16))
    out, slots, saved = _saved(
        lambda: mk.mamba_chunk_scan_combined(
            x, dt, A, B, C, 8, D=D, z=z, dt_bias=dt_bias, dt_softplus=True
        )
    )
    bf16, fp32 = torch.bfloat16, torch.float32
    # MambaChunkScanCombinedFn: (out_x, x, dt, dA_cumsum, A, B, C, D, z, dt_bias, initial_states,
    # seq_idx); dA_cumsum fp32 [b, h, chunks, chunk_size].
    assert slots == [
        ((2, 20, 4, 8), bf16),
        ((2, 20, 4, 8), bf16),
        ((2, 20, 4), bf16),
        ((2, 4, 3, 8), fp32),
        ((4,), fp32),
        ((2, 20, 2, 16), bf16),
        ((2, 20, 2, 16), bf16),
        ((4,), fp32),
        ((2, 20, 4, 8), bf16),
        ((4,), fp32),
        None,
        None,
    ]
    # The inputs themselves, not copies.
    assert [saved[i].data_ptr() for i in (1, 2, 5, 6, 8)] == [
        t.data_ptr() for t in (x, dt, B, C, z)
    ]
    assert out.dtype == bf16


def test_split_conv_scan_saves_what_the_gpu_kernel_saves():
    zxbcdt = torch.randn(2, 20, 32 + 32 + 64 + 4, requires_grad=True)
    weight, bias = torch.randn(96, 4, requires_grad=True), torch.randn(96, requires_grad=True)
    dt_bias, A, D = torch.zeros(4), -torch.ones(4), torch.ones(4, requires_grad=True)
    _, slots, saved = _saved(
        lambda: mk.mamba_split_conv1d_scan_combined(
            zxbcdt, weight, bias, dt_bias, A, D, 8, headdim=8, ngroups=2
        )
    )
    fp32 = torch.float32
    # MambaSplitConv1dScanCombinedFn: (zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias,
    # initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight, outproj_bias): None where
    # Megatron Core passes no states, fused norm or out-projection.
    assert slots == [
        ((2, 20, 132), fp32),
        ((96, 4), fp32),
        ((96,), fp32),
        ((2, 20, 4, 8), fp32),
        ((4,), fp32),
        ((4,), fp32),
        ((4,), fp32),
        *[None] * 6,
    ]
    assert saved[0].data_ptr() == zxbcdt.data_ptr()


def test_gated_norm_and_conv_save_what_the_gpu_kernels_save():
    x = torch.randn(3, 2, 32, requires_grad=True)
    gate = torch.randn(3, 2, 32, requires_grad=True)
    norm = mk.RMSNormGated(32, group_size=16, norm_before_gate=False)
    _, slots, saved = _saved(norm, x, gate)
    fp32 = torch.float32
    # LayerNormFn: (x, weight, bias, mean, rstd, z): x and z as [M, N] views, rstd fp32 [groups·M].
    assert slots == [((6, 32), fp32), ((32,), fp32), None, None, ((12,), fp32), ((6, 32), fp32)]
    assert saved[0].data_ptr() == x.data_ptr() and saved[5].data_ptr() == gate.data_ptr()

    # CausalConv1dFn: (x, weight, bias, seq_idx, initial_states); a channel-last x is kept as given.
    x = torch.randn(2, 20, 12).transpose(1, 2).requires_grad_()
    weight, bias = torch.randn(12, 4, requires_grad=True), torch.randn(12, requires_grad=True)
    _, slots, saved = _saved(mk.causal_conv1d_fn, x, weight, bias, None, None, False, None, "silu")
    assert slots == [((2, 12, 20), fp32), ((12, 4), fp32), ((12,), fp32), None, None]
    assert saved[0].data_ptr() == x.data_ptr()


class _GradModeOps(TorchDispatchMode):
    """Counts the ops that run with grad mode on: what the probe counts as replay in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += torch.is_grad_enabled()
        return func(*args, **(kwargs or {}))


def test_backward_derives_gradients_without_replaying_under_autograd():
    # A kernel's backward is not a replay: it runs nothing with grad mode on (which the probe would
    # count as MCore's replay, harness.probe.measurement.measure).
    zxbcdt = torch.randn(2, 20, 32 + 32 + 64 + 4, requires_grad=True)
    weight, bias = torch.randn(96, 4, requires_grad=True), torch.randn(96, requires_grad=True)
    dt_bias, A, D = torch.zeros(4), -torch.ones(4), torch.ones(4, requires_grad=True)
    out = mk.mamba_split_conv1d_scan_combined(
        zxbcdt, weight, bias, dt_bias, A, D, 8, headdim=8, ngroups=2
    )
    norm = mk.RMSNormGated(32, group_size=16, norm_before_gate=False)
    loss = (
        norm(out, out.detach()).sum()
        + mk.causal_conv1d_fn(zxbcdt[..., :20].mT, weight[:20], bias[:20]).sum()
    )
    seed = torch.ones(())  # made here: .backward() would make it under grad mode
    with _GradModeOps() as mode:
        loss.backward(seed)
    assert mode.ops == 0


def test_what_megatron_core_never_passes_is_refused():
    x, dt, A, B, C, _D, _z, _dt_bias = _ssm_inputs(seqlen=8)
    with pytest.raises(NotImplementedError, match="seq_idx"):
        mk.mamba_chunk_scan_combined(
            x, dt, A, B, C, 8, seq_idx=torch.zeros(2, 8, dtype=torch.int32)
        )
