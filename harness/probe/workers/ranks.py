"""A probe whose ranks run under torchrun on gloo: started, bounded, and read back.

The pipeline probe (``harness.probe.layouts.pipeline``) and the tensor-parallel probe
(``harness.probe.layouts.tensor_parallel``) start their ranks here, through the estimate's launcher
(``harness.processes.run_cpu_torchrun``); each rank (``harness.probe.workers.rank_worker``) writes its
``ModelProbe`` with ``probe --json``'s own writer (``harness.probe.present.table.probe_json``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from harness.errors import UsageError
from harness.probe.runner import DTYPES, ModelProbe
from harness.processes import run_cpu_torchrun

RANK_WORKER = "harness.probe.workers.rank_worker"
MAX_RANKS = 8  # one CPU rank each
RANKS_TIMEOUT_S = 600.0  # as the estimate's ranks: a loaded 2-core machine runs them ~4x slower


def check_rank_count(option: str, ranks: int, unit: str) -> None:
    """Refuse a layout size outside [2, ``MAX_RANKS``] (UsageError): one CPU rank per ``unit``."""
    if not 2 <= ranks <= MAX_RANKS:
        raise UsageError(
            f"{option} must be in [2, {MAX_RANKS}] (one CPU rank per {unit}; 1 is the probe "
            f"itself), got {ranks}"
        )


def run_probe_ranks(
    model: str,
    layout: str,
    ranks: int,
    *,
    precisions: Sequence[str],
    attention_backend: str,
    what: str,
    timeout_s: float = RANKS_TIMEOUT_S,
) -> list[list[ModelProbe]]:
    """Per precision (in ``precisions``' order), the ``ModelProbe`` of each of ``ranks`` ranks of
    ``harness.probe.workers.rank_worker``, in rank order, probing ``model`` on ``layout`` (its
    option: ``--pipeline-parallel``, ``--tensor-parallel``): one torchrun job for every precision. A
    job that fails or hangs raises RuntimeError naming ``what`` and the cause (its last line, or the
    timeout: its process tree was killed)."""
    for precision in precisions:
        if precision not in DTYPES:
            raise UsageError(f"unknown precision {precision!r}; known: {', '.join(DTYPES)}")
    worker_args = [
        "--model",
        model,
        layout,
        str(ranks),
        "--precision",
        *precisions,
        "--attention-backend",
        attention_backend,
        "--timeout",
        str(timeout_s),
    ]
    child, texts = run_cpu_torchrun(ranks, RANK_WORKER, worker_args, timeout_s=timeout_s)
    if child is None:
        raise RuntimeError(f"hang: {what} ran past {timeout_s:.0f} s; its processes were killed")
    if child.returncode != 0 or len(texts) != ranks:
        tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{what} failed (exit {child.returncode}): {tail}")
    by_rank = [[ModelProbe.from_dict(probe) for probe in json.loads(text)] for text in texts]
    return [[probes[index] for probes in by_rank] for index in range(len(precisions))]
