"""The isolated probe's child process: ``python -m harness.probe.workers.isolated_child`` (started by
``harness.probe.workers.isolate.IsolatedProbe``): gloo + the model, ``READY``, one measured row, ``RESULT {json}``."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import threading
import time

from harness.config.fields import RecomputeFields
from harness.cpu.deferred_compile import defer_compile_before_megatron_core
from harness.probe.plan import ProbeRow
from harness.probe.workers.isolate import READY, RESULT, RUNAWAY


def main(argv: list[str]) -> int:
    defer_compile_before_megatron_core()  # CPU adapter part 4
    parser = argparse.ArgumentParser(prog="harness.probe.workers.isolated_child")
    parser.add_argument("--model", required=True)
    parser.add_argument("--fields", required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--add-bias-linear", action="store_true")
    parser.add_argument("--seq-length", type=int)
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--lifetime", type=float, required=True)
    parser.add_argument("--attention-backend", default="unfused")
    parser.add_argument("--runaway-threads", type=int, default=0, help="0: no thread watch")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.lifetime, exit=True)
    sizes = {
        key: value
        for key, value in (
            ("seq_length", args.seq_length),
            ("micro_batch_size", args.micro_batch_size),
        )
        if value is not None
    }
    sizes["attention_backend"] = args.attention_backend

    from harness.cpu.adapter import init_cpu_parallel_state
    from harness.probe.runner import measure_row_pair

    init_cpu_parallel_state(seed=args.seed)
    row = ProbeRow(
        RecomputeFields.from_dict(json.loads(args.fields)), add_bias_linear=args.add_bias_linear
    )
    print(READY, flush=True)
    if args.runaway_threads > 0 and os.path.isdir(_TASKS):
        threading.Thread(
            target=_report_runaway, args=(args.runaway_threads,), name="runaway", daemon=True
        ).start()
    payload = measure_row_pair(args.model, row, seed=args.seed, **sizes)
    print(RESULT + json.dumps(payload), flush=True)
    return 0


_TASKS = "/proc/self/task"  # this process's threads (Linux)


def _report_runaway(limit: int) -> None:
    """Print ``RUNAWAY <n>`` once more than ``limit`` threads have started since READY (see
    harness.probe.workers.isolate): a reentrant backward without end. Its threads take the GIL in turn, so
    this one runs."""
    alive_at_ready = len(os.listdir(_TASKS))
    while True:
        time.sleep(0.1)
        started = len(os.listdir(_TASKS)) - alive_at_ready
        if started > limit:
            print(f"{RUNAWAY}{started}", flush=True)
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
