#!/usr/bin/env bash
# Nightly GPU tier (H100 runners). Runs `pytest -m gpu` (each test skips naming what the runner lacks),
# which writes one run record per row under $RECOMPUTE_HARNESS_GPU_OUT; compares every record set with
# the golden of its recipe x hardware x revision pins; publishes markdown + JUnit under $REPORT_DIR.
# Exit status: non-zero when a GPU test failed, a comparison failed, or a record set has no golden.
# The 16-GPU Nemotron study runs on two nodes: `recompute-harness launch --slurm --recipe
# nemotron-3-nano-full-16gpu --out $RECOMPUTE_HARNESS_GPU_OUT` writes its sbatch job (same records).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
export RECOMPUTE_HARNESS_GPU_OUT="${RECOMPUTE_HARNESS_GPU_OUT:-$root/runs/nightly-$stamp}"
report="${REPORT_DIR:-$RECOMPUTE_HARNESS_GPU_OUT/report}"
mkdir -p "$RECOMPUTE_HARNESS_GPU_OUT" "$report"
status=0

./venv-run recompute-harness revisions | tee "$report/revisions.txt"
./venv-run pytest -m gpu tests/gpu -rs --junitxml "$report/gpu-tests.xml" | tee "$report/gpu-tests.txt" || status=1

shopt -s nullglob
for records in "$RECOMPUTE_HARNESS_GPU_OUT"/*/records; do
  sweep="$(basename "$(dirname "$records")")"
  golden="$(./venv-run python -m harness.golden.store "$records")"
  if [[ ! -f "$golden" ]]; then
    echo "no golden for $sweep: expected $golden (refresh with ci/golden-refresh.sh)" | tee -a "$report/summary.md"
    status=1
    continue
  fi
  ./venv-run recompute-harness compare --golden "$golden" "$records" > "$report/$sweep-compare.md" || status=1
  ./venv-run recompute-harness analyze "$records" --plot "$report/$sweep.png" > "$report/$sweep-analysis.md" || status=1
  echo "$sweep: $(head -n 1 "$report/$sweep-compare.md")" >> "$report/summary.md"
done
echo "report: $report"
exit "$status"
