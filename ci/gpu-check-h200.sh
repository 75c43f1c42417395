#!/usr/bin/env bash
# GPU check for issue 5 on one H200 (fits <= 8 minutes): the mcore back end (no Bridge, no Transformer
# Engine on that image) with a moonlight-style model sized for one GPU, rows [] moe_act mla_up_proj moe
# core_attn; writes run records, a golden for this hardware profile (with provenance) and the paired
# instrumentation-overhead figure, all under $OUT.
#
# Prepare on the CPU machine (the device cannot reach any index), then carry build/wheels:
#   ./venv-run pip download --no-deps --only-binary=:all: -d build/wheels megatron-core==0.19.2 \
#       rich markdown-it-py mdurl pygments matplotlib contourpy cycler fonttools kiwisolver pillow \
#       pyparsing python-dateutil six numpy pyyaml packaging
#   run(command="bash ci/gpu-check-h200.sh", carry=["build/wheels"], timeout_s=540)
# Without Transformer Engine the mcore back end binds TE's FP8-state names to "FP8 disabled"
# (harness.cpu.adapter.bind_fp8_disabled_without_te), so mla_up_proj runs; moe_act builds
# SequentialMLP experts without TE and does nothing (the CPU probe's requires-TE): expect no saving.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/runs/gpu-check}"
mkdir -p "$OUT"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
python=python3
exec > >(tee "$OUT/gpu-check.log") 2>&1

nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
"$python" -c 'import sys, torch; assert sys.version_info[:2] == (3, 12), sys.version; assert torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda)'
"$python" -m pip install --quiet --no-index --find-links build/wheels megatron-core==0.19.2 rich matplotlib
"$python" -m harness.cli revisions | tee "$OUT/revisions.txt"

# 1. The sweep: one torchrun job per row, records + analysis table + plot.
status=0
timeout 420 "$python" -m harness.cli run --recipe mcore-moonlight-1gpu --out "$OUT/runs" --timeout 150 || status=$?
records="$(ls -d "$OUT"/runs/*/records | head -n 1)"

# 2. A golden for this hardware profile, written by the harness from these records (provenance inside).
"$python" -m harness.cli golden refresh --golden-dir "$OUT/golden" --allow-failed "$records" || status=$?

# 3. Paired instrumentation cost (target <= 1% of step time).
timeout 120 "$python" benchmarks/instrumentation_overhead.py --recipe mcore-moonlight-1gpu --blocks 6 \
    --block-iters 5 --json "$OUT/instrumentation-overhead.json" || status=$?
echo "gpu-check exit status $status; outputs under $OUT"
exit "$status"
