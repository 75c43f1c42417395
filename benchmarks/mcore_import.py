"""What the CPU adapter's deferred ``torch.compile`` (harness.cpu.deferred_compile) saves each process.

Every CPU rank, probe child and CLI process imports Megatron Core, whose ``jit_fuser`` decorations call
``torch.compile`` at import. Measured here: the median wall time of ``--repeat`` fresh interpreters that
import ``megatron.core.transformer.transformer_config`` (what the validator and every model need), with
the deferral installed first and without it, and whether TorchDynamo / Inductor were imported.

    ./venv-run python benchmarks/mcore_import.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
start = time.perf_counter()
if {defer}:
    from harness.cpu.deferred_compile import defer_compile_before_megatron_core
    defer_compile_before_megatron_core()
import torch
torch_s = time.perf_counter() - start
import megatron.core.transformer.transformer_config
print(json.dumps({{"torch_s": torch_s, "total_s": time.perf_counter() - start,
                  "dynamo": "torch._dynamo" in sys.modules, "inductor": "torch._inductor" in sys.modules}}))
"""


def measure(defer: bool, repeat: int) -> dict[str, object]:
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(defer=defer)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        "total_s": statistics.median(run["total_s"] for run in runs),
        "mcore_s": statistics.median(run["total_s"] - run["torch_s"] for run in runs),
        "dynamo": runs[0]["dynamo"],
        "inductor": runs[0]["inductor"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for defer in (False, True):
        result = measure(defer, args.repeat)
        print(
            f"{'deferred' if defer else 'upstream':<9} import torch + MCore {result['total_s']:.2f} s "
            f"(MCore {result['mcore_s']:.2f} s), dynamo imported: {result['dynamo']}, "
            f"inductor imported: {result['inductor']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
