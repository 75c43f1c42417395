#!/usr/bin/env bash
# Golden refresh after a Megatron Core bump.
#   1. bump megatron-core in pyproject.toml (./venv-run reinstalls on first use), or put the new
#      Megatron Core first on PYTHONPATH / install it in your own environment;
#   2. ci/golden-refresh.sh [--cpu-only] [--jobs=N] [RECIPE...]   (default recipes: the cases the nightly
#      compares, harness/golden/nightly.py; --jobs=N: the CPU probe's passes run at once, default one
#      per usable core);
# ci/golden-refresh.sh --list: those cases, CASE GOLDEN per line ('-': none yet for the installed pins),
#   the same list as ci/nightly-gpu.sh --list; runs nothing.
#   3. review the printed diffs and the summary, commit tests/golden/ (new pins get new files; old stay).
# ci/golden-refresh.sh --all-revisions: the label manifests and CPU goldens (both attention back ends)
#   of every supported revision (tests/support/overlays.py REVISIONS: 0.18.2, 0.19.0, the venv's
#   0.19.2, the development head from $MEGATRON_LM_GIT), each tree first on PYTHONPATH; nothing else.
# Goldens are only ever written by the harness from fresh records, with their provenance. Writes are
# idempotent: on an unchanged revision nothing under tests/golden/ changes, byte for byte.
# Environment: RECOMPUTE_HARNESS_PYTHON=/path/to/python (or an activated virtualenv) runs the harness
# in that environment instead of ./venv-run's .venv; RECOMPUTE_HARNESS_GPU_OUT=DIR keeps GPU records there.
set -uo pipefail
shopt -s nullglob
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cpu_only=0
all_revisions=0
list=0
jobs=()
recipes=()
for arg in "$@"; do
  case "$arg" in
    --cpu-only) cpu_only=1 ;;
    --all-revisions) all_revisions=1 ;;
    --list) list=1 ;;
    --jobs=*) jobs=(--jobs "${arg#--jobs=}") ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "golden-refresh: unknown option $arg" >&2; exit 2 ;;
    *) recipes+=("$arg") ;;
  esac
done
python="${RECOMPUTE_HARNESS_PYTHON:-}"
if [[ -z "$python" && -n "${VIRTUAL_ENV:-}" ]]; then python="$VIRTUAL_ENV/bin/python"; fi
if [[ -z "$python" && -n "${CONDA_PREFIX:-}" ]]; then python="$CONDA_PREFIX/bin/python"; fi
harness() {
  if [[ -n "$python" ]]; then "$python" -m harness.cli "$@"; else ./venv-run recompute-harness "$@"; fi
}
py() { if [[ -n "$python" ]]; then "$python" "$@"; else ./venv-run python "$@"; fi; }

if [[ $list -eq 1 ]]; then
  harness nightly list; exit $?
fi
if [[ $cpu_only -eq 0 && ${#recipes[@]} -eq 0 ]]; then
  mapfile -t recipes < <(harness nightly recipes) || exit 2
fi

if [[ $all_revisions -eq 1 ]]; then
  # One probe pass per revision and back end, each in its own process with its tree first on
  # PYTHONPATH (a Megatron Core is imported once per process). Any failure stops the refresh (exit 2).
  started=$SECONDS
  out_file=$(mktemp) && trap 'rm -f "$out_file"' EXIT
  revisions=$(py -c 'import sys; sys.path.insert(0, "tests/support"); import overlays; print(*overlays.REVISIONS)') || exit 2
  for revision in $revisions; do
    tree=$(py tests/support/overlays.py --path "$revision") || { echo "golden-refresh: no tree for $revision" >&2; exit 2; }
    printf '\n== %s (%s)\n' "$revision" "${tree:-the venv}"
    for command in "labels --write-manifest" "probe --all --write-golden ${jobs[*]}" "probe --all --attention-backend fused --write-golden ${jobs[*]}"; do
      # shellcheck disable=SC2086  # the command's words
      if ! PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" harness $command >"$out_file"; then
        cat "$out_file"; echo "golden-refresh: $revision: $command failed" >&2; exit 2
      fi
      grep -E '(^| )(wrote|unchanged) ' "$out_file" || true
    done
  done
  printf '\n== summary (%s s)\n' "$((SECONDS - started))"
  git -C "$root" status --short -- tests/golden 2>/dev/null || true
  exit 0
fi

refreshed=()
left=()
next=()
started=$SECONDS
step() { printf '\n== %s\n' "$*"; }

# The CPU half: identity, label diff + manifest, matrix drift report, one probe of every style model
# (its passes on --jobs workers) writing the CPU goldens; it prints its own summary and wall times.
step "CPU half: recompute-harness bump"
harness bump "${jobs[@]}"; cpu_rc=$?
case $cpu_rc in
  0) ;;
  1) left+=("CPU half: drift to fix (see its summary above)"); next+=("follow the CPU summary's next step, then rerun") ;;
  *) echo "golden-refresh: the CPU half was refused (see above); nothing was written" >&2; exit 2 ;;
esac

if [[ $cpu_only -eq 0 ]]; then
  out="${RECOMPUTE_HARNESS_GPU_OUT:-$root/runs/refresh-$(date -u +%Y%m%dT%H%M%SZ)}"
  for recipe in "${recipes[@]}"; do
    step "GPU recipe $recipe"
    # A row that fails is recorded as such; the refresh below refuses failed rows unless expected.
    harness run --recipe "$recipe" --out "$out" || true
  done
  record_dirs=("$out"/*/records)
  if [[ ${#record_dirs[@]} -eq 0 ]]; then
    left+=("GPU goldens (no recipe wrote records under $out)")
    next+=("run on the GPU runner the goldens describe, or pass --cpu-only on a CPU machine")
  fi
  for records in "${record_dirs[@]}"; do
    step "GPU golden from $records"
    harness golden refresh --golden-dir tests/golden --dry-run "$records"
    if harness golden refresh --golden-dir tests/golden "$records"; then refreshed+=("golden from $records")
    else left+=("golden from $records (refused, see above)"); fi
  done
else
  left+=("GPU goldens (--cpu-only)")
fi

step "summary ($((SECONDS - started)) s; the CPU half's own summary is above)"
echo "GPU goldens refreshed: ${#refreshed[@]}"
for item in "${refreshed[@]}"; do echo "  $item"; done
echo "left: ${#left[@]}"
for item in "${left[@]}"; do echo "  $item"; done
if [[ ${#next[@]} -gt 0 ]]; then
  echo "next step:"
  for item in "${next[@]}"; do echo "  $item"; done
else
  echo "next step: review the diffs above and commit tests/golden/"
fi
git -C "$root" status --short -- tests/golden 2>/dev/null || true
# Exit 1 while drift is left to fix (the CI job fails with the summary above); --cpu-only alone does not fail.
[[ ${#next[@]} -eq 0 ]]
