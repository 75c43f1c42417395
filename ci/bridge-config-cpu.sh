#!/usr/bin/env bash
# The Bridge half of the GPU tier, on a CPU machine: Megatron Bridge builds every bridge recipe's row
# configs through the harness's `bridge` back end and runs its own pre-training validation on them
# (tests/gpu/test_bridge_config.py, including the pre-launch refusal of a row Bridge rejects). Run it
# on a Megatron Bridge or Megatron Core bump, before the nightly GPU job finds out.
#
# Environment: .venv-bridge = .venv (torch 2.14.1+cu130, megatron-core 0.19.2, through a .pth file) +
# Transformer Engine 2.20.2, whose torch extension is built here against the CUDA toolkit (measured:
# 528 s on 2 cores, once; no GPU is needed to build or import it) + Megatron Bridge 0.6.2 and the
# packages its import needs, pinned in ci/bridge-cpu-requirements.txt. Rebuilt when this script or
# that file changes. Needs nvcc with torch's CUDA major (13).
#   ci/bridge-config-cpu.sh [pytest args]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail() { echo "ci/bridge-config-cpu.sh: $*" >&2; exit 2; }

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

venv="$root/.venv-bridge"
stamp="$(cat "$0" ci/bridge-cpu-requirements.txt | sha256sum | cut -c1-16)"
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

# TE looks for cuDNN, NVRTC and cuRAND in its own environment's nvidia wheels; they are .venv's.
export CUDNN_HOME="$nvidia/cudnn" NVRTC_HOME="$nvidia/cu13" CURAND_HOME="$nvidia/cu13"
export LD_LIBRARY_PATH="$nvidia/cu13/lib:$nvidia/nccl/lib:$nvidia/cudnn/lib:$nvidia/nvshmem/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$venv/bin/python" -c "import transformer_engine.pytorch, megatron.bridge" 2>/dev/null \
  || fail "Transformer Engine or Megatron Bridge does not import in $venv (delete it to rebuild)"
exec "$venv/bin/python" -m pytest -m gpu tests/gpu/test_bridge_config.py -rs -p no:cacheprovider "$@"
