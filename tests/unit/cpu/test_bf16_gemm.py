"""The estimate worker's bf16 products computed in fp32 keep every byte count: the same tensors saved
for backward and the same MemTracker peak, the values within bf16 rounding. In a child process: the
kernels replace torch's for the whole process, which no other test may see."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import json, sys, torch
from torch.distributed._tools.mem_tracker import MemTracker

def step():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, dtype=torch.bfloat16)
    x = torch.randn(3, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    tracker = MemTracker()
    tracker.track_external(linear)
    with tracker, torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append((tuple(t.shape), str(t.dtype))) or t, lambda t: t
    ):
        y = linear(x)
        scores = torch.baddbmm(torch.empty(3, 16, 16, dtype=torch.bfloat16), y, y.transpose(1, 2),
                               beta=0.0, alpha=0.5)
        z = torch.bmm(scores, y)
        z.float().sum().backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return saved, peak, z.detach().float().flatten().tolist()

native = step()
from harness.cpu.bf16_gemm import compute_bf16_products_in_fp32
compute_bf16_products_in_fp32()
upcast = step()
print(json.dumps({"native": native, "upcast": upcast}))
"""


def test_bf16_products_in_fp32_keep_saved_tensors_and_peaks():
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    (saved, peak, values), (saved_up, peak_up, values_up) = result["native"], result["upcast"]
    assert saved_up == saved and saved  # the very shapes and dtypes autograd keeps
    assert peak_up == peak > 0  # MemTracker sees no fp32 copy
    # bf16 has 8 significand bits: the two kernels round the same fp32 sums, in another order
    assert all(abs(a - b) <= 2**-7 * max(abs(a), 1.0) for a, b in zip(values, values_up))
