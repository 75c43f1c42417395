#!/usr/bin/env bash
# Golden refresh after a Megatron Core bump (run on the GPU runner the goldens describe).
#   1. bump megatron-core in pyproject.toml; ./venv-run reinstalls on first use;
#   2. ci/golden-refresh.sh [RECIPE...]   (default: the GPU recipes this runner can hold);
#   3. review the printed diffs, commit tests/golden/ (new pins get new files; old ones stay).
# Goldens are only ever written by the harness from fresh records, with their provenance.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${RECOMPUTE_HARNESS_GPU_OUT:-$root/runs/refresh-$(date -u +%Y%m%dT%H%M%SZ)}"
recipes=("$@")
if [[ ${#recipes[@]} -eq 0 ]]; then
  recipes=(mcore-moonlight-1gpu moonlight-short-8gpu nemotron-3-nano-short-8gpu moonlight-full-8gpu)
fi
./venv-run recompute-harness revisions
./venv-run recompute-harness labels --check || true   # prints the label diff against the newest manifest
./venv-run recompute-harness labels --write-manifest   # the label manifest is a golden too
./venv-run recompute-harness matrix --check   # the matrix must still agree with the new validator
./venv-run recompute-harness probe --all --check-golden || true   # per-label diff of the CPU goldens
./venv-run recompute-harness probe --all --write-golden           # CPU goldens for the new fingerprint
for recipe in "${recipes[@]}"; do
  # A row that fails is recorded as such; the refresh below refuses failed rows unless expected.
  ./venv-run recompute-harness run --recipe "$recipe" --out "$out" || true
done
for records in "$out"/*/records; do
  # The real refresh prints (and puts in the step summary) the same diff a dry run would: once, not twice.
  ./venv-run recompute-harness golden refresh --golden-dir tests/golden "$records"
done
git -C "$root" status --short tests/golden
