#!/usr/bin/env bash
# Nightly GPU tier (H100 runners). Runs `pytest -m gpu` (each test skips naming what the runner lacks),
# which writes one run record per row under $RECOMPUTE_HARNESS_GPU_OUT; compares every record set with
# the golden the nightly's one list of cases names (harness/golden/nightly.py: the exact revision pins,
# or a seed study's card golden by effects only); publishes markdown + JUnit under $REPORT_DIR.
#   ci/nightly-gpu.sh          the night
#   ci/nightly-gpu.sh --list   CASE GOLDEN per line ('-': no golden for the installed pins); runs nothing
# Exit status: non-zero when the machine has no GPU (one line, nothing run), a case has no golden for
# the installed pins (one line per case, naming the pins and the refresh command), a GPU test failed, a
# comparison failed, no GPU test ran (all skipped: a runner whose driver or image is broken is no green
# night), or no record was written; each said in one line on stderr and in summary.md. Partial and
# fault sweeps (scratch/) are kept in the report but never compared.
# The 16-GPU Nemotron study runs on two nodes: `recompute-harness launch --slurm --recipe
# nemotron-3-nano-full-16gpu --out $RECOMPUTE_HARNESS_GPU_OUT` writes its sbatch job (same records).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
case "${1:-}" in
  "") ;;
  --list) exec ./venv-run recompute-harness nightly list ;;
  *) echo "nightly: unknown argument ${1} (ci/nightly-gpu.sh [--list])" >&2; exit 2 ;;
esac
# Before anything runs or is written: a machine without a GPU is no night at all.
gpus="$(./venv-run python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
if [[ "$gpus" == 0 ]]; then
  echo "nightly: no CUDA GPU is visible on this machine: the GPU tier runs on the H100 runners (ci/nightly-gpu.sh --list shows what it compares)" >&2
  exit 1
fi
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
export RECOMPUTE_HARNESS_GPU_OUT="${RECOMPUTE_HARNESS_GPU_OUT:-$root/runs/nightly-$stamp}"
report="${REPORT_DIR:-$RECOMPUTE_HARNESS_GPU_OUT/report}"
mkdir -p "$RECOMPUTE_HARNESS_GPU_OUT" "$report"
status=0

./venv-run recompute-harness revisions | tee "$report/revisions.txt"
: > "$report/summary.md"
fail() { echo "nightly: $*" | tee -a "$report/summary.md" >&2; status=1; }
# Every case the night compares needs a golden of the installed pins (or, for a seed study, the card's).
while IFS= read -r missing; do fail "$missing"; done < <(./venv-run recompute-harness nightly check || true)
./venv-run pytest -m gpu tests/gpu -rs --junitxml "$report/gpu-tests.xml" | tee "$report/gpu-tests.txt" || status=1
# How many GPU tests actually ran (pytest's JUnit file: tests - skipped), and the first skip's reason.
ran="$(./venv-run python - "$report/gpu-tests.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    suites = ET.parse(sys.argv[1]).getroot().iter("testsuite")
except (OSError, ET.ParseError) as exc:
    print(f"0 0 0 no JUnit file ({exc})")
    raise SystemExit
total = skipped = 0
reason = ""
for suite in suites:
    total += int(suite.get("tests", 0))
    skipped += int(suite.get("skipped", 0))
    for skip in suite.iter("skipped"):
        if not reason and skip.get("message"):
            reason = skip.get("message").splitlines()[0]
print(total - skipped, total, skipped, reason)
PY
)"
read -r executed total skipped reason <<< "$ran"
if [[ "${executed:-0}" == 0 ]]; then
  fail "no GPU test ran ($total collected, $skipped skipped${reason:+: $reason})"
fi

shopt -s nullglob
for records in "$RECOMPUTE_HARNESS_GPU_OUT"/*/records; do
  sweep="$(basename "$(dirname "$records")")"
  compare_rc=0
  ./venv-run recompute-harness nightly compare "$records" > "$report/$sweep-compare.md" \
    2> "$report/$sweep-compare.err" || compare_rc=$?
  if [[ $compare_rc -eq 2 ]]; then  # refused: no golden, or another workload than the golden's
    fail "$sweep: $(head -n 1 "$report/$sweep-compare.err")"
    continue
  fi
  [[ $compare_rc -eq 0 ]] || status=1
  ./venv-run recompute-harness analyze "$records" --plot "$report/$sweep.png" > "$report/$sweep-analysis.md" || status=1
  echo "$sweep: $(head -n 1 "$report/$sweep-compare.md")" >> "$report/summary.md"
done
compared=("$RECOMPUTE_HARNESS_GPU_OUT"/*/records)
if (( ${#compared[@]} == 0 && ${executed:-0} > 0 )); then  # (no test ran: already said)
  fail "the GPU tests wrote no record to compare under $RECOMPUTE_HARNESS_GPU_OUT"
fi
echo "report: $report"
exit "$status"
