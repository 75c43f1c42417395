"""The program torchrun starts on every rank: ``python -m harness.run.worker ROW_DIR``.

It reads ``ROW_DIR/spec.json`` (written by the runner: the recipe as data and the row), runs
the recipe's back end, and reports through ``harness.run.instrument``. ``@record`` makes torchrun
write this rank's exception and traceback to its ``TORCHELASTIC_ERROR_FILE`` as well.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from harness.config.revisions import collect_revisions
from harness.cpu.deferred_compile import (
    compile_disabled,
    defer_compile_before_megatron_core,
    run_compiled_helpers_eagerly,
)
from harness.processes import die_with_parent
from harness.run.environment import environment_differences, recorded_environment
from harness.run.events import SPEC_FILE
from harness.run.instrument import Instrument
from harness.run.recipes import Recipe


def read_spec(row_dir: Path) -> dict[str, Any]:
    return json.loads((Path(row_dir) / SPEC_FILE).read_text(encoding="utf-8"))


@record
def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    defer_compile_before_megatron_core()  # CPU adapter part 4 (no-op with an NVIDIA driver)
    die_with_parent()  # torchrun gone (its runner SIGKILLed, say): this rank must not train on alone
    row_dir = Path(args[0])
    spec = read_spec(row_dir)
    recipe = Recipe.from_dict(spec["recipe"])
    if recipe.device == "cpu":
        run_compiled_helpers_eagerly()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    instrument = Instrument(row_dir, rank, recipe.device)
    # This interpreter's stack, read before the back end's import (a rank whose import fails still says
    # what it would have run): inside a container it is the image's, which the runner cannot see.
    instrument.revisions(collect_revisions())
    # Eager or compiled helpers change step time, not memory: the record says which ran.
    instrument.note("torch_compile", "disabled" if compile_disabled() else "enabled")
    running = recorded_environment(os.environ)
    instrument.environment(running)
    try:
        differences = environment_differences(spec.get("environment", running), running)
        if differences:  # the runner gives it exactly: a difference is a launcher changing it
            raise RuntimeError(
                "this rank's environment is not the row's declared one: " + "; ".join(differences)
            )
        # Import before announcing the start: the stall clock then never counts import time.
        if recipe.backend == "mcore":
            from harness.run.backend_mcore import train
        else:
            from harness.run.backend_bridge import train
        instrument.started(world)
        train(recipe, spec["row"], instrument)
    except BaseException as exc:
        instrument.failed(exc)
        raise
    instrument.finished()


if __name__ == "__main__":
    main()
    # Everything is reported and flushed: skip the interpreter teardown of torch and Megatron (seconds
    # per rank), which only delays torchrun noticing that the row finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
