"""Paired measurement of the runner's per-rank instrumentation cost (target: <= 1% of step time on GPU).

One process, one model (the mcore back end's ``build``), alternating blocks of iterations in rounds
(each round one block of each arm, the first arm rotating), reported as a step-time effect: the mean
log-ratio over rounds with its 95 % confidence interval (harness.record.step_time), beside the median
of pairs:
instrumented exactly as the runner does (phase lines, loss hook, device sync + step timing,
allocator peak reads, the iteration line) versus bare (the same ``MCoreTraining.step`` with no-op
phases and no per-iteration sync; one sync per block). Alternating blocks pair the two arms against
drift (thermal, allocator warm-up). World of one: on GPU it needs one CUDA device; on CPU it runs under
the CPU adapter (a CPU figure says nothing about the GPU target — it is printed as such).

    ./venv-run python benchmarks/instrumentation_overhead.py --recipe mcore-moonlight-1gpu --blocks 6 --block-iters 5
    ./venv-run python benchmarks/instrumentation_overhead.py --recipe cpu-moonlight-ep2 --cpu
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from harness.run.recipes import Recipe


class BareInstrument:
    """The worker's instrument with every measurement removed: phases are no-ops."""

    @contextlib.contextmanager
    def phase(self, iteration: int, name: str) -> Iterator[None]:
        yield

    def loss(self, loss: Any, iteration: int) -> Any:
        return loss

    def read_allocated(self, point: str) -> None:
        """No memory_allocated() reads (the instrumented arm makes them)."""


def _world_of_one() -> None:
    from harness.run.torchrun import free_port

    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
    )


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def one_device_recipe(name: str, *, cpu: bool) -> Recipe:
    """``name`` on one device of this machine (its EP folded away), the process group started for
    a GPU run (a CPU run starts its own world of one)."""
    from harness.run.recipes import load_recipe

    base = load_recipe(name)
    recipe = dataclasses.replace(
        base,
        device="cpu" if cpu else "cuda",
        nnodes=1,
        nproc_per_node=1,
        parallelism=dataclasses.replace(base.parallelism, ep=1),
    )
    if not cpu:
        _world_of_one()
    return recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="mcore-moonlight-1gpu")
    parser.add_argument("--row", default="[]")
    parser.add_argument(
        "--cpu", action="store_true", help="run on CPU (world of one; mechanics only)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--blocks", type=int, default=6, help="pairs of blocks (instrumented, bare)"
    )
    parser.add_argument("--block-iters", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    from harness.record.step_time import round_effect
    from harness.run.backend_mcore import build, instrumented_iteration
    from harness.run.instrument import Instrument

    recipe = one_device_recipe(args.recipe, cpu=args.cpu)
    device = recipe.device
    with tempfile.TemporaryDirectory() as events_dir:
        instrument = Instrument(Path(events_dir), 0, device)
        training = build(recipe, args.row, instrument)
        bare = BareInstrument()
        iteration = 0
        for _ in range(args.warmup):
            iteration += 1
            instrumented_iteration(training, iteration, instrument)
        arms: dict[str, list[float]] = {"instrumented": [], "bare": []}
        for block in range(args.blocks):
            # Rounds in rotated order (instrumented first in even rounds, bare in odd ones): drift
            # inside a round (clocks, allocator) favours neither arm over the run.
            for arm in ("instrumented", "bare")[:: 1 if block % 2 == 0 else -1]:
                _sync(device)
                started = time.perf_counter()
                for _ in range(args.block_iters):
                    iteration += 1
                    if arm == "instrumented":
                        instrumented_iteration(training, iteration, instrument)
                    else:
                        training.step(iteration, bare)
                _sync(device)
                arms[arm].append((time.perf_counter() - started) * 1000.0 / args.block_iters)
    bare_ms = statistics.median(arms["bare"])
    instrumented_ms = statistics.median(arms["instrumented"])
    paired = [(i - b) / b * 100.0 for i, b in zip(arms["instrumented"], arms["bare"])]
    # Judged as a step-time effect in rounds (harness.record.step_time): the mean log-ratio over
    # rounds with its 95 % interval, so a 5 % median of pairs from -15 % to +32 % reads inconclusive.
    effect = round_effect(arms["instrumented"], arms["bare"])
    interval = effect.interval_pct()
    result = {
        "recipe": args.recipe,
        "row": args.row,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "bare_step_ms_median": bare_ms,
        "instrumented_step_ms_median": instrumented_ms,
        "overhead_pct_median_of_pairs": statistics.median(paired),
        "overhead_pct_pairs": paired,
        "overhead_pct_mean_of_rounds": effect.pct,
        "overhead_pct_ci95": None if interval is None else list(interval),
        "blocks": args.blocks,
        "block_iters": args.block_iters,
    }
    print(json.dumps(result, indent=2))
    if device == "cpu":
        print(
            "note: CPU figure (world of one, CPU adapter); the <= 1% target is for GPU step times"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
