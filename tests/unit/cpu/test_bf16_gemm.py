"""CPU adapter part 11: bf16 products computed on the fp32 kernels keep every byte count the estimate
reads: the same tensors saved for backward and the same MemTracker peak, the values within bf16
rounding. The mode is entered outside the tracker, as ``measure_kinds`` enters it."""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from harness.cpu.bf16_gemm import bf16_gemms_on_fp32_kernels


def _step() -> tuple[list[tuple[tuple[int, ...], torch.dtype]], int, torch.Tensor]:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, dtype=torch.bfloat16)
    x = torch.randn(3, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(tensor.shape), tensor.dtype))
        return tensor

    tracker = MemTracker()
    tracker.track_external(linear)
    with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = linear(x)
        scores = torch.baddbmm(
            torch.empty(3, 16, 16, dtype=torch.bfloat16), y, y.transpose(1, 2), beta=0.0, alpha=0.5
        )
        z = torch.bmm(scores, y)
        out = torch.empty(16, 48, dtype=torch.bfloat16)
        torch.matmul(
            z[0].detach(), linear.weight.detach().t()[:48, :48], out=out
        )  # an out= variant
        z.float().sum().backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return saved, peak, torch.cat([z.detach().flatten(), out.flatten()]).float()


def test_bf16_products_on_fp32_kernels_keep_saved_tensors_and_peaks():
    saved, peak, values = _step()
    with bf16_gemms_on_fp32_kernels():
        saved_up, peak_up, values_up = _step()
    assert saved_up == saved and saved  # the very shapes and dtypes autograd keeps
    assert peak_up == peak > 0  # MemTracker sees no fp32 copy
    # bf16 has 8 significand bits: the two kernels round fp32 sums made in another order
    assert torch.allclose(values_up, values, rtol=2**-7, atol=2**-7)


def test_other_dtypes_run_torchs_own_kernels_bitwise():
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    with bf16_gemms_on_fp32_kernels():
        inside = a @ b
    assert torch.equal(inside, a @ b)
