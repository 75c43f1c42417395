#!/usr/bin/env bash
# GPU check on one H200: the mcore back end (no Bridge, no Transformer Engine on that image) with a
# moonlight-style model sized for one GPU, rows [] moe_act mla_up_proj moe core_attn. Steps:
# requirements, install (carried wheels), revisions, sweep (run records), golden (written by the harness
# from those records, provenance inside), overhead (paired instrumentation cost). Every step reports,
# whatever the others did; the device returns at most 8 files, 2 folders deep, so everything is packed
# into $OUT/gpu-check.tar.gz beside a short $OUT/summary.txt (one line per step, then the rows).
#
# Budget (the device: one command <= 600 s, 15 min of device time per session, start-up included):
# the whole script keeps within GPU_CHECK_BUDGET_S (420 s): the sweep gets at most 240 s and what the
# budget leaves after reserving the overhead step (<= 90 s) and the packing; run it with timeout_s=480
# (60 s margin; ~8 min of command + a few minutes' start leaves time for nothing else, so no rerun).
# The archive is rewritten (atomically) after every step and whenever the sweep finishes a row, and on
# SIGTERM/SIGINT: a kill at any moment leaves a readable archive of what was done.
#
#   ci/gpu-check-h200.sh                    on the GPU machine
#   ci/gpu-check-h200.sh --rehearse-on-cpu  the same steps on this CPU machine (.venv, recipe
#                                           cpu-moonlight-ep2, a short overhead run): tests the script
#   ci/gpu-check-h200.sh --calibrate [--rehearse-on-cpu]
#       noise calibration, what a short GPU window does first (issue 42; docs/measured-gpu.md): the
#       row set in GPU_CHECK_ROUNDS rounds (default 3; `run --rounds`, each round rotated), moe_act an
#       A/A repeat of [] on the mcore image (SequentialMLP experts ignore it); then `noise` (warm-up,
#       within-job and between-job noise, each row's effect per round: noise-calibration.json) and a
#       golden written from the rounds. No overhead step. 5 rows x 3 rounds x ~21 s a job on the H200
#       (the 2026-12-04 records' timestamps) is ~315 s: GPU_CHECK_BUDGET_S defaults to 450 (8 min
#       with run(timeout_s=480)). On CPU: a copy of cpu-moonlight-ep2 with 10 iterations, rows [] and
#       moe_act, 2 rounds (the golden step checks that CPU times are refused as a timing golden).
#
# Prepare on the CPU machine (the device cannot reach any index), then carry build/wheels:
#   ./venv-run pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d build/wheels $(./venv-run python ci/gpu_check_requirements.py --pins) \
#       markdown-it-py mdurl pygments contourpy cycler fonttools kiwisolver pillow \
#       pyparsing python-dateutil six numpy pyyaml packaging
#   run(command="bash ci/gpu-check-h200.sh", carry=["build/wheels"], timeout_s=480)
# The requirements step (ci/gpu_check_requirements.py) names, on one line, everything missing: Python
# 3.12, torch at the project's lower bound, the carried distributions at the lock's exact versions
# (ci/constraints-cpu.txt) as wheels usable on this platform, a CUDA GPU; then nothing else runs. g++ /
# ninja / Python.h are optional: only Megatron Core's share_storage_ext (compiled on first use of
# mla_up_proj) needs them, so without them that row is reported requires-extension and the rest runs.
# Without Transformer Engine the mcore back end binds TE's FP8-state names to "FP8 disabled"
# (harness.cpu.adapter.bind_fp8_disabled_without_te), so mla_up_proj runs; moe_act builds
# SequentialMLP experts without TE and does nothing (the CPU probe's requires-TE): expect no saving.
# GPU_CHECK_SWEEP_LIMIT_S overrides the sweep's wall-clock limit; GPU_CHECK_BUDGET_S the whole budget;
# GPU_CHECK_ROWS (row names, space-separated, with the [] control) measures those rows instead of the
# recipe's own: a second lease's further rows, landed as records (they make no golden: a partial set).
# Exit status: 0 every step passed, 1 a step failed, 2 requirements missing (or bad arguments).
set -uo pipefail  # no -e: a failing step is reported and the next one still runs
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mode=gpu
calibrate=0
for argument in "$@"; do
  case "$argument" in
    --rehearse-on-cpu) mode=cpu ;;
    --calibrate) calibrate=1 ;;
    *) echo "usage: ci/gpu-check-h200.sh [--calibrate] [--rehearse-on-cpu]" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-$root/runs/gpu-check}"
mkdir -p "$OUT"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log="$work/gpu-check.log"
summary="$OUT/summary.txt"
: > "$summary"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

if [[ "$mode" == cpu ]]; then
  ./venv-run python -c "import torch" >/dev/null 2>&1  # creates or reuses .venv
  # A shared CPU machine can be 10x slower than idle: generous row limits (the recipe's own are 120/60 s).
  python="$root/.venv/bin/python" recipe=cpu-moonlight-ep2 budget=840 sweep_cap=600 overhead_cap=180
  row_timeout=280 stall_timeout=240
  bench=(--cpu --warmup 1 --blocks 2 --block-iters 2) requirement_flags=(--cpu)
  echo "gpu-check rehearsal on CPU ($recipe): mechanics only, no GPU number" >> "$summary"
else
  python=python3 recipe=mcore-moonlight-1gpu budget=420 sweep_cap=240 overhead_cap=90
  row_timeout=150 stall_timeout=120
  bench=(--blocks 6 --block-iters 5) requirement_flags=()
fi
rounds=()
if (( calibrate )); then
  if [[ "$mode" == cpu ]]; then
    # Steady time needs >= 6 timed iterations (harness.record.step_time): the CPU recipe's 4 are too few.
    sed -e 's/^train_iters = .*/train_iters = 10/' -e 's/^steady_window = .*/steady_window = [3, 10]/' \
      -e 's/^rows = .*/rows = ["[]", "moe_act"]/' harness/data/recipes/cpu-moonlight-ep2.toml \
      > "$work/cpu-moonlight-ep2-calibration.toml"
    recipe="$work/cpu-moonlight-ep2-calibration.toml" rounds=(--rounds "${GPU_CHECK_ROUNDS:-2}")
  else
    budget=450 sweep_cap=400 rounds=(--rounds "${GPU_CHECK_ROUNDS:-3}")
  fi
  overhead_cap=0
  echo "noise calibration: ${rounds[1]} rounds of the row set, rotated" >> "$summary"
fi
budget="${GPU_CHECK_BUDGET_S:-$budget}"
deadline=$((SECONDS + budget))
pack_reserve=15
status=0
running=""
packed=0

say() { echo "$*" >> "$summary"; }
left() { echo $((deadline - SECONDS)); }
pack() {  # the archive of everything so far, replaced atomically (a reader never sees half of one)
  local files
  files="$(find "$work" -type f | wc -l)"
  if tar -czf "$OUT/.gpu-check.tar.gz.part" -C "$work" . 2>> "$log"; then
    mv -f "$OUT/.gpu-check.tar.gz.part" "$OUT/gpu-check.tar.gz"
  else
    rm -f "$OUT/.gpu-check.tar.gz.part"
    say "archive: failed (tar)"
    status=1
  fi
  packed="$files"
}
stopped() {  # SIGTERM/SIGINT: stop the running step, keep what it finished, say so
  trap - TERM INT
  if [[ -n "$running" ]]; then
    kill -TERM "$running" 2> /dev/null
    wait "$running" 2> /dev/null
  fi
  say "stopped by signal: the archive holds what finished before"
  pack
  exit 143
}
trap stopped TERM INT
step() {  # step NAME COMMAND...: run it, log it, one summary line whatever happens, archive after
  local name="$1" rc
  shift
  echo "== $name: $*" >> "$log"
  "$@" >> "$log" 2>&1 &
  running=$!
  while kill -0 "$running" 2> /dev/null; do  # a row's finished record reaches the archive at once
    sleep 1
    if [[ "$(find "$work" -type f -path '*/records/*.json' | wc -l)" != "${recorded:-0}" ]]; then
      recorded="$(find "$work" -type f -path '*/records/*.json' | wc -l)"
      pack
    fi
  done
  wait "$running"
  rc=$?
  running=""
  if (( rc == 0 )); then
    say "$name: ok"
  else
    say "$name: failed (exit $rc): $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-300)"
    status=1
  fi
  pack
  return "$rc"
}
limited() {  # limited NAME CAP RESERVE COMMAND...: a step under min(CAP, budget left - RESERVE) seconds
  local name="$1" cap="$2" reserve="$3" limit
  shift 3
  limit=$(( $(left) - reserve ))
  if (( limit < 10 )); then
    say "$name: skipped (the ${budget} s budget is spent)"
    status=1
    return 1
  fi
  (( limit > cap )) && limit="$cap"
  step "$name" timeout "$limit" "$@"
}

[[ "$mode" == gpu ]] && step device nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
requirements="$("$python" ci/gpu_check_requirements.py build/wheels "${requirement_flags[@]}" 2>&1)"
rc=$?
say "$requirements"
echo "$requirements" >> "$log"
if (( rc != 0 )); then
  for skipped in install revisions share-storage-ext sweep golden overhead; do say "$skipped: skipped (requirements missing)"; done
  pack
  exit 2
fi
rows=()  # the recipe's own rows, unless mla_up_proj cannot build its extension here
without_extension="$(sed -n 's/.*no extension toolchain (\([^)]*\)).*/\1/p' <<< "$requirements")"

if [[ "$mode" == gpu ]]; then
  read -r -a pins <<< "$("$python" ci/gpu_check_requirements.py --pins)"  # the lock's exact versions
  step install "$python" -m pip install --quiet --no-index --find-links build/wheels "${pins[@]}"
fi
step revisions bash -c 'set -o pipefail; "$0" -m harness.cli revisions | tee "$1"' "$python" "$work/revisions.txt"

if [[ -z "$without_extension" ]]; then
  # MCore compiles share_storage_ext (torch's load_inline: g++ + ninja) the first time mla_up_proj runs, inside
  # a timed step and the stall window; built here first (torch caches it), it proves the toolchain works too.
  step share-storage-ext "$python" -c "from megatron.core.tensor_parallel.random import _get_share_storage; _get_share_storage()"
else
  say "share-storage-ext: skipped (no $without_extension)"
  read -r -a rows <<< "$("$python" -c "import sys; from harness.run.recipes import load_recipe; print(' '.join(r for r in (sys.argv[2].split() or load_recipe(sys.argv[1]).rows) if r not in ('[]', 'mla_up_proj')))" "$recipe" "${GPU_CHECK_ROWS:-}")"
  rows=(--rows "${rows[@]}")
fi
if [[ -z "$without_extension" && -n "${GPU_CHECK_ROWS:-}" ]]; then
  read -r -a rows <<< "$GPU_CHECK_ROWS"
  rows=(--rows "${rows[@]}")
fi

# The sweep: one torchrun job per row, records + analysis table + plot; the overhead step's time reserved.
limited sweep "${GPU_CHECK_SWEEP_LIMIT_S:-$sweep_cap}" $((overhead_cap + pack_reserve)) \
  "$python" -m harness.cli run --recipe "$recipe" "${rows[@]}" "${rounds[@]}" \
  --out "$work/runs" --timeout "$row_timeout" --stall-timeout "$stall_timeout"
records="$(find "$work/runs" -mindepth 2 -maxdepth 2 -type d -name records -print -quit 2>/dev/null)"
if (( calibrate )) && [[ -n "$records" ]]; then
  step noise bash -c 'set -o pipefail; "$0" -m harness.cli noise "$1" --json "$2" | tee "$3"' \
    "$python" "$records" "$work/noise-calibration.json" "$work/noise.txt" \
    && sed 's/^/noise: /' "$work/noise.txt" >> "$summary"
fi
if [[ -n "$records" ]] && compgen -G "$records/*.json" > /dev/null; then
  if [[ -n "${GPU_CHECK_ROWS:-}" ]]; then
    say "golden: skipped (GPU_CHECK_ROWS: a chosen row set makes no golden; its records are in the archive)"
  elif [[ $mode == cpu ]]; then
    # CPU step times are no timing golden: the harness refuses them (docs/bump.md), and the rehearsal
    # checks exactly that refusal on these records; on the GPU the same command writes the golden.
    echo "== golden (expected refusal on CPU records)" >> "$log"
    if "$python" -m harness.cli golden refresh --golden-dir "$work/golden" --allow-failed "$records" >> "$log" 2>&1; then
      say "golden: failed (CPU records were accepted as a timing golden)"
      status=1
    else
      say "golden: ok (refused on CPU records, as it must be; a GPU run writes the golden)"
    fi
  else
    # A golden for this hardware profile, written by the harness from these records (provenance inside).
    step golden "$python" -m harness.cli golden refresh --golden-dir "$work/golden" --allow-failed "$records"
  fi
else
  say "golden: skipped (the sweep wrote no records)"
  status=1
fi

# Paired instrumentation cost (target <= 1% of step time on GPU); not in a calibration's window.
(( calibrate )) || limited overhead "$overhead_cap" "$pack_reserve" "$python" benchmarks/instrumentation_overhead.py \
  --recipe "$recipe" "${bench[@]}" --json "$work/instrumentation-overhead.json"

if [[ -n "$without_extension" ]]; then
  say "row mla_up_proj: requires-extension (Megatron Core's share_storage_ext needs $without_extension)"
fi
if [[ -n "$records" ]]; then  # the rows as measured, in a few lines (the records themselves are in the archive)
  "$python" - "$records" "$work/instrumentation-overhead.json" >> "$summary" 2>> "$log" <<'PY'
import json, sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("*.json")):
    record = json.loads(path.read_text())
    head, outcome = record["metrics"]["headline"], record["outcome"]
    peak = head["peak_allocated_bytes"]
    step = head["step_time_ms"]
    print(f"row {path.stem}: {outcome['status']} on {record['hardware']['device']}; "
          f"peak {'-' if peak is None else f'{peak / 2**30:.3f} GiB'} after iteration {head['peak_after_iteration']}; "
          f"step {'-' if step is None else f'{step:.1f} ms'}")
overhead = Path(sys.argv[2])
if overhead.exists():
    figures = json.loads(overhead.read_text())
    print(f"overhead: {figures['overhead_pct_median_of_pairs']:.2f} % (median of {figures['blocks']} pairs, "
          f"{figures['device']})")
PY
fi
say "archive: gpu-check.tar.gz ($(find "$work" -type f | wc -l) files: log, revisions, records, golden, overhead)"
say "exit status $status"
pack
exit "$status"
