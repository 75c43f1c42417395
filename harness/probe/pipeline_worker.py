"""One stage of the pipeline probe (``torchrun --nproc-per-node PP -m harness.probe.pipeline_worker``).

Each rank probes its stage (``harness.probe.pipeline.stage_probe``) and writes ``rank<r>.json`` into
``--out``: its stage's ``ModelProbe``. Started by ``harness.probe.pipeline.probe_pipeline``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cpu.deferred_compile import (
    defer_compile_before_megatron_core,
    run_compiled_helpers_eagerly,
)
from harness.processes import die_with_parent


def main(argv: list[str]) -> int:
    die_with_parent()  # a killed harness (or torchrun agent) takes this rank with it
    defer_compile_before_megatron_core()  # CPU adapter part 4, before Megatron Core imports
    run_compiled_helpers_eagerly()  # byte counts are the same
    parser = argparse.ArgumentParser(prog="harness.probe.pipeline_worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--pipeline-parallel", type=int, required=True)
    parser.add_argument("--precision", required=True)
    parser.add_argument("--attention-backend", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    # Imported here: Megatron Core must not import before the deferral above.
    import torch.distributed as dist

    from harness.files import write_json_atomic
    from harness.probe.pipeline import stage_probe
    from harness.probe.table import probe_json

    probe = stage_probe(
        args.model,
        args.pipeline_parallel,
        precision=args.precision,
        attention_backend=args.attention_backend,
        timeout_s=args.timeout,
    )
    write_json_atomic(args.out / f"rank{dist.get_rank()}.json", probe_json(probe))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
