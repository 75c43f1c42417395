#!/usr/bin/env bash
# The CPU Bridge step: the Bridge half of the GPU tier, executed on a CPU machine with Megatron Bridge
# and Transformer Engine imported for real. It runs everything of the GPU tier that needs no kernel:
#   1. every GPU test collects (`pytest -m gpu --collect-only tests/gpu`: an import error anywhere fails);
#   2. tests/gpu/test_bridge_config.py: every bridge recipe row's config built by Bridge's own recipe
#      through the harness's `bridge` back end, validated by Bridge's pre-training update, its
#      environment computed and checked against what a rank applies; the metrics callback's four events
#      on a real CPU-built Megatron Core model and a real optimizer; the pre-launch refusals.
# Run on a Megatron Bridge or Megatron Core bump, before the nightly GPU job finds out; .ci/run runs
# it with --if-built (skipped, saying so, where the set-up below was never built).
#
# Environment: .venv-bridge = .venv (torch 2.14.1+cu130, megatron-core 0.19.2, through a .pth file) +
# Transformer Engine 2.20.2, whose torch extension is built here against the CUDA toolkit (measured:
# 528 s on 2 cores, once; no GPU is needed to build or import it) + Megatron Bridge 0.6.2 and the
# packages its import needs, pinned in ci/bridge-cpu-requirements.txt. Rebuilt when the set-up (the
# part of this script between the SETUP marks) or that file changes. Needs nvcc with torch's CUDA major (13).
#   ci/bridge-config-cpu.sh [--if-built] [pytest args]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail() { echo "ci/bridge-config-cpu.sh: $*" >&2; exit 2; }
venv="$root/.venv-bridge"
# The set-up's identity: the lines between the SETUP marks and the pinned requirements.
stamp="$(sed -n '/^# SETUP BEGIN/,/^# SETUP END/p' "$0" | cat - ci/bridge-cpu-requirements.txt | sha256sum | cut -c1-16)"
if [[ "${1:-}" == --if-built ]]; then
  shift
  if [[ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]]; then
    echo "ci/bridge-config-cpu.sh: skipped: $venv is not built for this set-up (run ci/bridge-config-cpu.sh once, ~10 min, to build it)" >&2
    exit 0
  fi
fi
started_step=$SECONDS

# SETUP BEGIN

./venv-run python -c "import torch" >/dev/null  # creates or reuses .venv
project_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
torch_cuda="$(.venv/bin/python -c 'import torch; print(torch.version.cuda)')"
nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[[ -x "$nvcc" ]] || fail "needs the CUDA toolkit (nvcc) to build Transformer Engine's torch extension"
nvcc_cuda="$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
[[ "${nvcc_cuda%%.*}" == "${torch_cuda%%.*}" && "${torch_cuda%%.*}" == 13 ]] \
  || fail "nvcc is CUDA $nvcc_cuda and torch is built for CUDA $torch_cuda: both must be CUDA 13"
cuda_home=""  # the toolkit whose headers the build compiles against ($CUDA_HOME, else the usual places)
for candidate in "${CUDA_HOME:-}" /usr/local/cuda "$(dirname "$(dirname "$(readlink -f "$nvcc")")")"; do
  if [[ -n "$candidate" && -f "$candidate/include/crt/host_config.h" ]]; then cuda_home="$candidate"; break; fi
done
[[ -n "$cuda_home" ]] || fail "no CUDA toolkit headers found (set CUDA_HOME to the toolkit nvcc belongs to)"
nvidia="$project_site/nvidia"  # the CUDA 13 libraries and headers torch's wheels brought

if [[ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$venv"
  "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$venv"
  printf '%s\n%s\n' "$project_site" "$root" > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz_project.pth"
  install=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps)
  "${install[@]}" -r ci/bridge-cpu-requirements.txt
  "${install[@]}" transformer-engine-cu13==2.20.2 transformer-engine==2.20.2
  started=$SECONDS
  NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="$(nproc)" CUDA_HOME="$cuda_home" \
    CPATH="$nvidia/cu13/include:$nvidia/nccl/include:$nvidia/cudnn/include" \
    "${install[@]}" --no-build-isolation transformer-engine-torch==2.20.2
  echo "Transformer Engine's torch extension: $((SECONDS - started)) s"
  "${install[@]}" megatron-bridge==0.6.2
  echo "$stamp" > "$venv/.stamp"
fi
# SETUP END

# TE looks for cuDNN, NVRTC and cuRAND in its own environment's nvidia wheels; they are .venv's.
export CUDNN_HOME="$nvidia/cudnn" NVRTC_HOME="$nvidia/cu13" CURAND_HOME="$nvidia/cu13"
export LD_LIBRARY_PATH="$nvidia/cu13/lib:$nvidia/nccl/lib:$nvidia/cudnn/lib:$nvidia/nvshmem/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$venv/bin/python" -c "import transformer_engine.pytorch, megatron.bridge" 2>/dev/null \
  || fail "Transformer Engine or Megatron Bridge does not import in $venv (delete it to rebuild)"
bridge_pytest() { "$venv/bin/python" -m pytest -p no:cacheprovider "$@"; }
# 1. Every GPU test collects with Bridge and TE importable (nothing runs).
collected="$(bridge_pytest -m gpu --collect-only -q tests/gpu 2>&1)" \
  || { echo "$collected" | tail -n 20; fail "the GPU tests do not all collect (above)"; }
echo "$collected" | tail -n 1
# 2. The Bridge half, executed.
rc=0
# test_bridge_metrics.py last: it starts a world of one (gloo) and the CPU adapter for its model.
bridge_pytest -m gpu tests/gpu/test_bridge_config.py tests/gpu/test_bridge_metrics.py -rs "$@" || rc=$?
echo "ci/bridge-config-cpu.sh: exit $rc in $((SECONDS - started_step)) s" >&2
exit $rc
