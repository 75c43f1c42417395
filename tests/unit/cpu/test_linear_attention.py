"""The CPU stand-ins of fla's Gated DeltaNet kernels: the numbers of a torch reference (Megatron Core's
own ``torch_chunk_gated_delta_rule``, its deterministic-mode convolution), forward and gradients, and
autograd keeping exactly what fla's autograd functions keep (fla-core 0.6.0)."""

from __future__ import annotations

from typing import Self

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from harness.cpu import adapter, linear_attention


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


def _delta_rule_inputs(length: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch, heads, k_dim, v_dim = 2, 3, 16, 8

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    q = F.normalize(draw(batch, length, heads, k_dim), dim=-1).to(dtype)
    k = F.normalize(draw(batch, length, heads, k_dim), dim=-1).to(dtype)
    v = draw(batch, length, heads, v_dim).to(dtype)
    # Decays as steep as MCore's GDN draws them (-exp(A_log) * softplus, A up to 16): a chunk's
    # cumulative gate reaches a few hundred below zero.
    g = -16 * torch.rand(batch, length, heads, generator=generator)
    beta = torch.rand(batch, length, heads, generator=generator).to(dtype)
    return _leaves(q, k, v, g, beta)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# 32: one chunk shorter than fla's 64 (the probe's sequence); 100: a padded second chunk; 128: two.
@pytest.mark.parametrize("length", [32, 100, 128])
def test_gated_delta_rule_matches_megatron_cores_torch_reference(length):
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule

    inputs = _delta_rule_inputs(length, torch.float32)
    out, final_state = linear_attention.chunk_gated_delta_rule(*inputs)
    assert final_state is None and out.shape == inputs[2].shape and out.dtype == torch.float32
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, grad)

    reference_inputs = _leaves(*inputs)
    reference, _ = torch_chunk_gated_delta_rule(*reference_inputs)
    reference_grads = torch.autograd.grad(reference, reference_inputs, grad)
    assert _max_diff(out, reference) < 1e-6
    for name, ours, theirs in zip(
        ("q", "k", "v", "g", "beta"), grads, reference_grads, strict=True
    ):
        assert _max_diff(ours, theirs) < 2e-6, name


def test_gated_delta_rule_in_bf16_computes_in_fp32_and_answers_in_bf16():
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule

    inputs = _delta_rule_inputs(32, torch.bfloat16)
    out, _ = linear_attention.chunk_gated_delta_rule(*inputs)
    grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
    assert out.dtype == torch.bfloat16
    assert [g.dtype for g in grads] == [t.dtype for t in inputs]  # g stays fp32, as MCore passes it
    reference, _ = torch_chunk_gated_delta_rule(*_leaves(*inputs))
    assert _max_diff(out, reference) < 2e-2  # bf16 rounding of the output (and of A in backward)


def test_causal_conv1d_matches_megatron_cores_deterministic_convolution():
    generator = torch.Generator().manual_seed(1)
    x, weight = _leaves(torch.randn(2, 20, 12, generator=generator), torch.randn(12, 4))
    y, final_state = linear_attention.causal_conv1d(x, weight, activation="silu")
    grad = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, weight], grad)

    # MCore's deterministic_mode path: F.conv1d over [b, d, s], trimmed to the sequence, then SiLU.
    rx, rw = _leaves(x, weight)
    conv = F.conv1d(rx.transpose(1, 2), rw.unsqueeze(1), padding=3, groups=12)[..., :20]
    reference = F.silu(conv).transpose(1, 2)
    reference_grads = torch.autograd.grad(reference, [rx, rw], grad)
    assert final_state is None
    assert _max_diff(y, reference) == 0.0
    assert all(_max_diff(a, b) < 1e-6 for a, b in zip(grads, reference_grads, strict=True))


def test_l2norm_matches_its_formula():
    (x,) = _leaves(torch.randn(2, 5, 3, 16))
    y = linear_attention.l2norm(x)
    grad = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, grad)
    (rx,) = _leaves(x)
    reference = rx * torch.rsqrt(rx.pow(2).sum(-1, keepdim=True) + 1e-6)
    (reference_dx,) = torch.autograd.grad(reference, rx, grad)
    assert _max_diff(y, reference) < 1e-6 and _max_diff(dx, reference_dx) < 1e-6


class _Saved:
    """What autograd packs for backward, in order."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def __enter__(self) -> Self:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.tensors.append(tensor)
        return tensor

    def described(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [(tuple(t.shape), t.dtype) for t in self.tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gated_delta_rule_keeps_what_flas_kernel_keeps(dtype):
    q, k, v, g, beta = _delta_rule_inputs(32, dtype)
    with _Saved() as saved:
        linear_attention.chunk_gated_delta_rule(q, k, v, g, beta)
    # fla's ChunkGatedDeltaRuleFunction: q, k, v and beta as given (beta_raw and beta are one
    # tensor: the sigmoid is MCore's), the chunk-local cumulative gate in fp32 and A, one row of 64
    # per token in k's dtype (its None entries save nothing).
    assert saved.described() == [
        ((2, 32, 3, 16), dtype),
        ((2, 32, 3, 16), dtype),
        ((2, 32, 3, 8), dtype),
        ((2, 32, 3), torch.float32),
        ((2, 32, 3), dtype),
        ((2, 32, 3, linear_attention.CHUNK), dtype),
    ]
    assert [t is given for t, given in zip(saved.tensors, (q, k, v), strict=False)] == [True] * 3
    assert saved.tensors[4] is beta
    # The kept tensors own their storage: no padding to whole chunks kept alive.
    assert all(
        t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in saved.tensors[3:]
    )


def test_the_convolution_keeps_its_input_as_given_and_the_weight():
    projection = torch.randn(2, 20, 30, requires_grad=True) * 1
    x = projection[..., :12]  # a slice of a larger output, as MCore's qkv is: not contiguous
    weight = torch.randn(12, 4, requires_grad=True)
    with _Saved() as saved:
        linear_attention.causal_conv1d(x, weight, activation="silu")
    # fla's CausalConv1dFunction keeps x without making it contiguous (the whole projection stays
    # alive), the weight and the bias (None here: it saves nothing).
    assert saved.tensors[0] is x and not x.is_contiguous()
    assert x.untyped_storage().nbytes() == projection.numel() * 4
    assert saved.tensors[1] is weight and len(saved.tensors) == 2


def test_l2norm_keeps_its_output_and_the_fp32_rstd():
    x = torch.randn(2, 5, 3, 16, dtype=torch.bfloat16, requires_grad=True)
    with _Saved() as saved:
        y = linear_attention.l2norm(x)
    assert saved.tensors[0] is y
    assert saved.described() == [((2, 5, 3, 16), torch.bfloat16), ((2, 5, 3), torch.float32)]


@pytest.mark.parametrize(
    "call, what",
    [
        (
            lambda t: linear_attention.causal_conv1d(t, torch.ones(4, 2), cu_seqlens=[0, 3]),
            "packed",
        ),
        (lambda t: linear_attention.causal_conv1d(t, torch.ones(4, 2), residual=t), "a residual"),
        (
            lambda t: linear_attention.chunk_gated_delta_rule(
                t, t, t, t[..., 0], t[..., 0], output_final_state=True
            ),
            "a final state",
        ),
        (
            lambda t: linear_attention.chunk_gated_delta_rule(
                t, t, t, t[..., 0], t[..., 0], use_gate_in_kernel=True
            ),
            "use_gate_in_kernel",
        ),
    ],
)
def test_what_megatron_cores_gdn_never_asks_is_refused(call, what):
    with pytest.raises(NotImplementedError, match=what):
        call(torch.randn(1, 3, 2, 4))


def test_the_adapter_binds_the_stand_ins_where_fla_left_none():
    from megatron.core.ssm import gated_delta_net

    adapter.enable_cpu_adapter()
    assert gated_delta_net.HAVE_FLA
    for name in adapter.LINEAR_ATTENTION_MODULES["megatron.core.ssm.gated_delta_net"]:
        kernel = adapter.LINEAR_ATTENTION_KERNELS[name]
        assert getattr(gated_delta_net, name) is kernel
    # A name bound already (fla installed, or bound before) is left alone: binding again binds none.
    assert adapter.bind_linear_attention_without_fla() == []


class _OpsWithGradMode(TorchDispatchMode):
    """Counts ops that run with grad mode on: in backward, what the probe counts as replay."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += torch.is_grad_enabled()
        return func(*args, **(kwargs or {}))


def test_the_backward_passes_replay_nothing():
    q, k, v, g, beta = _delta_rule_inputs(100, torch.float32)
    x, weight = _leaves(torch.randn(2, 20, 12), torch.randn(12, 4))
    outputs = [
        linear_attention.chunk_gated_delta_rule(q, k, v, g, beta)[0],
        linear_attention.causal_conv1d(x, weight, activation="silu")[0],
        linear_attention.l2norm(x),
    ]
    grads = [torch.ones_like(out) for out in outputs]
    with _OpsWithGradMode() as ops:
        torch.autograd.backward(outputs, grads)
    assert ops.count == 0


def _recurrent_delta_product(q, k, v, g, beta, steps):
    """The definition, token by token: decay the state by exp(g_t), apply the token's ``steps``
    Householder updates S <- S - beta k (k^T S) + beta k v^T, then read o_t = S^T q_t / sqrt(K)."""
    batch, length, heads, k_dim = q.shape
    state = q.new_zeros(batch, heads, k_dim, v.shape[-1])
    outputs = []
    for t in range(length):
        state = state * g[:, t].exp()[..., None, None]
        for j in range(t * steps, (t + 1) * steps):
            k_j, b_j = k[:, j], beta[:, j][..., None, None]
            state = state - b_j * k_j[..., None] * (k_j[..., None, :] @ state)
            state = state + b_j * k_j[..., None] * v[:, j][..., None, :]
        outputs.append((q[:, t][..., None, :] @ state).squeeze(-2) * k_dim**-0.5)
    return torch.stack(outputs, dim=1)


@pytest.mark.parametrize("steps, length", [(2, 32), (3, 40)])
def test_gated_delta_product_matches_its_recurrence(steps, length):
    q, _, _, g, _ = _delta_rule_inputs(length, torch.float32)
    more = _delta_rule_inputs(length * steps, torch.float32, seed=1)
    k, v, beta = more[1], more[2], more[4]
    inputs = [q, k, v, g, beta]
    out, _ = linear_attention.chunk_gated_delta_product(q, k, v, g, beta, num_householder=steps)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, grad)
    reference_inputs = _leaves(*inputs)
    reference = _recurrent_delta_product(*reference_inputs, steps)
    reference_grads = torch.autograd.grad(reference, reference_inputs, grad)
    assert _max_diff(out, reference) < 1e-5
    for name, ours, theirs in zip(
        ("q", "k", "v", "g", "beta"), grads, reference_grads, strict=True
    ):
        assert _max_diff(ours, theirs) < 1e-4, name


def test_the_gated_delta_product_keeps_what_flas_kernel_keeps():
    q, _, _, g, _ = _delta_rule_inputs(32, torch.bfloat16)
    more = _delta_rule_inputs(64, torch.bfloat16, seed=1)
    k, v, beta = more[1], more[2], more[4]
    with _Saved() as saved:
        linear_attention.chunk_gated_delta_product(q, k, v, g, beta, num_householder=2)
    # fla's ChunkGatedDeltaProductFunction: q, k, v, the interleaved cumulative gate (fp32), beta
    # and A (a row of 64 per interleaved step, in k's dtype).
    assert saved.described() == [
        ((2, 32, 3, 16), torch.bfloat16),
        ((2, 64, 3, 16), torch.bfloat16),
        ((2, 64, 3, 8), torch.bfloat16),
        ((2, 64, 3), torch.float32),
        ((2, 64, 3), torch.bfloat16),
        ((2, 64, 3, linear_attention.CHUNK), torch.bfloat16),
    ]
