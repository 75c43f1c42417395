"""Wall time of the CPU runner path (target: the 2-rank test sweep in <= 30 s on the 2-core CI machine).

Runs the ``cpu-moonlight-ep2`` sweep exactly as tests/unit/run/test_runner.py does (real torchrun,
gloo, 2 ranks EP2, the [] control + one row, 4 steps each) and prints per-row and total wall time,
split into launch-to-first-report (torchrun + imports) and model build + training.

    ./venv-run python benchmarks/cpu_runner_time.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from harness.run.events import SPEC_FILE, events_path, read_row
from harness.run.recipes import load_recipe
from harness.run.runner import run_sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="cpu-moonlight-ep2")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    for attempt in range(args.repeat):
        with tempfile.TemporaryDirectory() as out:
            started = time.monotonic()
            _, results = run_sweep(recipe, Path(out))
            total = time.monotonic() - started
            rows = []
            for result in results:
                ranks = read_row(result.row_dir, recipe.world_size)
                spec_written = (result.row_dir / SPEC_FILE).stat().st_mtime
                start_events = [
                    json.loads(line)["t"]
                    for rank in range(recipe.world_size)
                    for line in events_path(result.row_dir, rank).read_text().splitlines()[:1]
                ]
                rows.append(
                    {
                        "row": result.row,
                        "status": result.outcome.status,
                        "wall_s": round(result.launch.elapsed_s, 2),
                        "launch_to_first_report_s": round(max(start_events) - spec_written, 2),
                        "build_and_train_s": round(
                            max(r.last_time for r in ranks) - max(start_events), 2
                        ),
                    }
                )
            print(
                json.dumps(
                    {
                        "attempt": attempt + 1,
                        "recipe": recipe.name,
                        "total_s": round(total, 2),
                        "rows": rows,
                    }
                )
            )


if __name__ == "__main__":
    main()
