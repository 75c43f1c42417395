"""Before a bridge sweep launches: Megatron Bridge's own validation of every row's config, off the GPUs.

A row that Bridge or Megatron Core refuses (full recompute under Nemotron's scoped CUDA graphs, say)
is then a one-line error in under a minute, not a failed multi-GPU launch. The check runs in a child
process: Bridge's import (~15 s) and the environment defaults it applies stay out of the runner, and
a child that hangs is killed with its process group.

The child sees the GPUs the workers will see (the runner's own environment): Bridge's validation
reads the device (``validate_flex_dispatcher_backend`` calls ``torch.cuda.get_device_properties(0)``
for a flex dispatcher) and the dispatcher fall-back depends on which EP packages import, so hiding
the GPUs would refuse every flex/HybridEP row, or validate another dispatcher than the workers run.
It allocates nothing on them, and it has exited before the first row launches.

    python -m harness.run.preflight REQUEST.json VERDICTS.json   (the child; the runner writes the request)

Under a container (``launch --slurm --container-image``) the batch node's interpreter is not the
ranks': the sbatch script first runs every pre-launch check as one srun step inside the image
(``python -m harness.cli run ... --preflight-only FILE``), which writes the stack it saw to FILE
(``write_stack``); the runner outside then launches with ``--preflighted FILE`` (``read_stack``) and
the records must carry that stack's pins.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.files import write_json_atomic
from harness.processes import run_bounded
from harness.run.recipes import Recipe

TIMEOUT_S = 600.0


def preflight_environment(recipe: Recipe) -> dict[str, str]:
    """The child's environment: the runner's (the workers' GPUs included), as rank 0 of the recipe's world
    (Bridge derives the data-parallel size from the world size)."""
    return {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(recipe.world_size)}


def check_bridge_rows(recipe: Recipe, rows: list[str], timeout_s: float = TIMEOUT_S) -> None:
    """Refuse the sweep, naming the row and Bridge's reason, when Bridge's validation rejects a row."""
    env = preflight_environment(recipe)
    with tempfile.TemporaryDirectory(prefix="preflight-") as scratch:
        request, verdicts = Path(scratch) / "request.json", Path(scratch) / "verdicts.json"
        write_json_atomic(request, {"recipe": recipe.as_dict(), "rows": rows})
        child = run_bounded(
            [sys.executable, "-m", "harness.run.preflight", str(request), str(verdicts)],
            timeout_s=timeout_s,
            env=env,
        )
        if child is None:
            raise UsageError(
                f"recipe {recipe.name!r}: Bridge's pre-launch check did not finish in "
                f"{timeout_s:g} s (killed)"
            )
        if child.returncode != 0 or not verdicts.exists():
            last = next(
                (line for line in reversed(child.stderr.splitlines()) if line.strip()), "no message"
            )
            raise UsageError(
                f"recipe {recipe.name!r}: Bridge's pre-launch check failed: {last.strip()}"
            )
        refused: dict[str, str] = json.loads(verdicts.read_text(encoding="utf-8"))
    if refused:
        row, reason = next(iter(refused.items()))
        more = (
            f" ({len(refused) - 1} more rows refused: {', '.join(list(refused)[1:])})"
            if len(refused) > 1
            else ""
        )
        raise UsageError(
            f"recipe {recipe.name!r} row {row!r}: Megatron Bridge refuses the config before launch: "
            f"{' '.join(reason.split())}{more}"
        )


def write_stack(path: Path, recipe: Recipe, rows: list[str]) -> None:
    """After every check passed in this interpreter: the stack the ranks will run, for the runner."""
    write_json_atomic(
        Path(path), {"recipe": recipe.name, "rows": rows, "revisions": collect_revisions()}
    )


def read_stack(path: Path, recipe: Recipe, rows: list[str]) -> dict[str, Any]:
    """The revisions an in-container preflight of this very sweep wrote; anything else is one line."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"--preflighted {path}: no readable preflight result ({exc.__class__.__name__}: {exc})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("revisions"), dict):
        raise UsageError(f"--preflighted {path}: not a preflight result (no revisions)")
    if data.get("recipe") != recipe.name or data.get("rows") != rows:
        raise UsageError(
            f"--preflighted {path}: checked recipe {data.get('recipe')!r} rows {data.get('rows')}, "
            f"not recipe {recipe.name!r} rows {rows}"
        )
    return data["revisions"]


def main(argv: list[str]) -> None:
    import megatron.bridge  # noqa: F401  (without Bridge: fail in a second, before torch and MCore load)

    from harness.run.backend_bridge import rejections

    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    write_json_atomic(
        Path(argv[1]), rejections(Recipe.from_dict(request["recipe"]), request["rows"])
    )


if __name__ == "__main__":
    main(sys.argv[1:])
