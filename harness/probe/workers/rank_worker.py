"""One rank of a multi-rank probe (``torchrun --nproc-per-node N -m harness.probe.workers.rank_worker``).

``--pipeline-parallel N``: the rank probes its pipeline stage (``harness.probe.layouts.pipeline.stage_probe``);
``--tensor-parallel N``: the rank runs the probe's rows on its share of a TP group with sequence
parallel (``harness.probe.layouts.tensor_parallel.rank_probe``). ``--precision`` may name several: one
probe each, in this one process (its start-up, torch's and Megatron Core's imports, paid once). Each
rank writes ``rank<r>.json`` into ``--out``: the list of its ``ModelProbe``s, one per precision, read
back by ``harness.probe.workers.ranks.run_probe_ranks``.
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
    parser = argparse.ArgumentParser(prog="harness.probe.workers.rank_worker")
    parser.add_argument("--model", required=True)
    layout = parser.add_mutually_exclusive_group(required=True)
    layout.add_argument("--pipeline-parallel", type=int)
    layout.add_argument("--tensor-parallel", type=int)
    parser.add_argument("--precision", required=True, nargs="+")
    parser.add_argument("--attention-backend", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    # Imported here: Megatron Core must not import before the deferral above.
    import torch.distributed as dist

    from harness.files import write_json_atomic
    from harness.probe.layouts.pipeline import stage_probe
    from harness.probe.layouts.tensor_parallel import rank_probe
    from harness.probe.present.table import probe_json

    options = {"attention_backend": args.attention_backend, "timeout_s": args.timeout}
    probes = [
        stage_probe(args.model, args.pipeline_parallel, precision=precision, **options)
        if args.pipeline_parallel is not None
        else rank_probe(args.model, args.tensor_parallel, precision=precision, **options)
        for precision in args.precision
    ]
    write_json_atomic(
        args.out / f"rank{dist.get_rank()}.json", [probe_json(probe) for probe in probes]
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
