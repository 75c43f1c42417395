"""Is interleaving inside one process quieter than separate jobs? (issue 42, item 1)

One process builds two rows' models (the mcore back end's ``build``, then ``training_for``) and runs
them in rounds: each round one block of ``--block-iters`` iterations of each, the first row rotating.
A round's value is each block's median step time; the noise is the spread over rounds of
``log(b / a)``. With ``--rows [] []`` it is an A/A pair: pure noise, to set beside the per-round
spread of separate jobs (``recompute-harness noise`` on a sweep in rounds: a pair of separate jobs
spreads by sqrt 2 times one job's spread).

    ./venv-run python benchmarks/interleaved_noise.py --cpu --rounds 8 --block-iters 5
    ./venv-run python benchmarks/interleaved_noise.py --recipe mcore-moonlight-1gpu --rows [] moe_act
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from harness.record.step_time import as_pct, round_effect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="cpu-moonlight-ep2")
    parser.add_argument("--rows", nargs=2, default=["[]", "[]"], metavar="ROW")
    parser.add_argument("--cpu", action="store_true", help="run on CPU (world of one)")
    parser.add_argument("--warmup", type=int, default=5, help="iterations of each row first")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-iters", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    from instrumentation_overhead import BareInstrument, _sync, one_device_recipe

    from harness.run.backend_mcore import build, training_for
    from harness.run.instrument import Instrument

    recipe = one_device_recipe(args.recipe, cpu=args.cpu)
    device = recipe.device
    bare = BareInstrument()
    with tempfile.TemporaryDirectory() as events_dir:
        instrument = Instrument(Path(events_dir), 0, device)
        first = build(recipe, args.rows[0], instrument)
        arms = [first, training_for(recipe, args.rows[1], instrument)]
        iteration = 0
        for arm in arms:
            for _ in range(args.warmup):
                iteration += 1
                arm.step(iteration, bare)
        medians: list[list[float]] = [[], []]
        for number in range(args.rounds):
            for which in (0, 1)[:: 1 if number % 2 == 0 else -1]:
                times = []
                for _ in range(args.block_iters):
                    iteration += 1
                    _sync(device)
                    started = time.perf_counter()
                    arms[which].step(iteration, bare)
                    _sync(device)
                    times.append((time.perf_counter() - started) * 1000.0)
                medians[which].append(statistics.median(times))
    effect = round_effect(medians[1], medians[0])
    spread = statistics.stdev(effect.log_ratios)
    result = {
        "recipe": args.recipe,
        "rows": args.rows,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "rounds": args.rounds,
        "block_iters": args.block_iters,
        "median_ms": medians,
        "effect_pct": effect.pct,
        "effect_ci95_pct": effect.interval_pct(),
        "pair_spread_pct": 100 * spread,
        "job_spread_of_each_arm_pct": [
            100 * statistics.stdev(math.log(t) for t in arm) for arm in medians
        ],
    }
    print(json.dumps(result, indent=2))
    print(
        f"interleaved {args.rows[0]} / {args.rows[1]}: {as_pct(effect.mean):+.1f} % over "
        f"{args.rounds} rounds, per-round spread of the pair {100 * spread:.1f} %"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
