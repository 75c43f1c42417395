"""Times ``plan`` end to end: ``plan --recipe`` for each shipped recipe it models, and ``plan
--world-size N -- <flags>`` for a Llama-3-8B-style Megatron-LM command, its layers measured afresh
(target: 60 s each on the 2-core machine, docs/plan.md). Run: ``./venv-run python
benchmarks/plan_recipes.py [--recipes-only | --flags-only]``."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

RECIPES = (
    "moonlight-full-8gpu",
    "nemotron-3-nano-full-16gpu",
    "llama3-70b-sft-fp8cs-32gpu",
    "mcore-moonlight-1gpu",
)
# A Llama-3-8B-style dense GPT on 16 GPUs (TP 2: two CPU ranks measure its layers at full width),
# as a Megatron-LM user launches it: biases off, GQA, SwiGLU, RoPE, distributed optimizer.
FLAG_COMMANDS = {
    "llama-3-8b-style-tp2": (
        16,
        (
            "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
            "--num-query-groups 8 --ffn-hidden-size 14336 --seq-length 4096 "
            "--max-position-embeddings 4096 --micro-batch-size 1 --tensor-model-parallel-size 2 "
            "--sequence-parallel --bf16 --use-distributed-optimizer --swiglu --normalization RMSNorm "
            "--disable-bias-linear --position-embedding-type rope --vocab-size 128256 "
            "--hidden-dropout 0 --attention-dropout 0"
        ),
    ),
}


def _time(name: str, argv: list[str]) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "plan", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    print(
        f"{name}: exit {done.returncode}, {wall:.1f} s wall, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


def main(argv: list[str]) -> int:
    if "--flags-only" not in argv:
        for recipe in RECIPES:
            _time(recipe, ["--recipe", recipe])
    if "--recipes-only" not in argv:
        for name, (world, flags) in FLAG_COMMANDS.items():
            _time(name, ["--world-size", str(world), "--", *shlex.split(flags)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
