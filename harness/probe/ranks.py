"""A probe whose ranks run under torchrun on gloo: started, bounded, and read back.

The pipeline probe (``harness.probe.pipeline``) and the tensor-parallel probe
(``harness.probe.tensor_parallel``) start their ranks here, through the estimate's launcher
(``harness.processes.run_cpu_torchrun``); each rank (``harness.probe.rank_worker``) writes its
``ModelProbe`` with ``probe --json``'s own writer (``harness.probe.table.probe_json``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from harness.probe.runner import ModelProbe, ProbeRowResult
from harness.processes import run_cpu_torchrun

RANK_WORKER = "harness.probe.rank_worker"


def run_probe_ranks(
    nproc: int, worker_args: Sequence[str], *, what: str, timeout_s: float
) -> list[ModelProbe]:
    """The ``ModelProbe`` of each of ``nproc`` ranks of ``harness.probe.rank_worker``, in rank order.
    A job that fails or hangs raises RuntimeError naming ``what`` and the cause (its last line, or
    the timeout: its process tree was killed)."""
    child, texts = run_cpu_torchrun(
        nproc, RANK_WORKER, [*worker_args, "--timeout", str(timeout_s)], timeout_s=timeout_s
    )
    if child is None:
        raise RuntimeError(f"hang: {what} ran past {timeout_s:.0f} s; its processes were killed")
    if child.returncode != 0 or len(texts) != nproc:
        tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{what} failed (exit {child.returncode}): {tail}")
    return [probe_from_json(json.loads(text)) for text in texts]


def probe_from_json(data: dict[str, Any]) -> ModelProbe:
    """A ``ModelProbe`` from a rank's file (``harness.probe.table.probe_json``, as ``probe --json``
    writes it: derived keys, such as the unmeasured rows, are not fields)."""
    rows = [ProbeRowResult.from_dict(row) for row in data["rows"]]
    names = {field.name for field in dataclasses.fields(ModelProbe)} - {"rows"}
    return ModelProbe(**{key: value for key, value in data.items() if key in names}, rows=rows)
