"""Probe rows as ``cpu-probe`` run records, and the CPU goldens they are compared with exactly.

One golden per style model per revision pin, under the golden root's cpu/ (``harness.record.golden_dir``),
written only from a real probe
run. Rejected and hung rows carry no measurements, so they are not golden rows (the validator's
verdicts are pinned by the compatibility matrix; the deadlock by its own unit test).
"""

from __future__ import annotations

import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.compare.comparator import Comparison, compare_records
from harness.probe.runner import ModelProbe, ProbeRowResult
from harness.probe.status import Equivalence
from harness.record.build import cpu_probe_metrics, hardware, new_record, outcome, parallelism, workload
from harness.record.golden import golden_from_records, load_golden, write_golden
from harness.record.golden_dir import golden_path_for, golden_root, newest_like
from harness.record.model import ProbeMetrics, Record

REFRESH_COMMAND = "./venv-run recompute-harness probe --all --write-golden"
CPU_HARDWARE = {"device": "cpu", "gpu_count": 0}


def recipe_name(model: str) -> str:
    return f"cpu-probe-{model}"


def _not_bitwise(equivalence: Equivalence) -> int:
    """How many of (loss, every parameter gradient) are not bit-identical to the control's."""
    return equivalence.differing_grads + (0 if equivalence.loss_equal else 1)


def row_metrics(row: ProbeRowResult) -> ProbeMetrics:
    return cpu_probe_metrics(
        retained_bytes=row.retained_bytes, backward_flops=row.backward_flops, replay_bytes=row.replay_bytes,
        replay_ops=row.replay_ops, not_bitwise_values=_not_bitwise(row.equivalence),
        dropout_not_bitwise_values=_not_bitwise(row.dropout_equivalence), carried_bytes=row.carried_bytes,
    )


def probe_records(probe: ModelProbe, revisions: dict[str, Any] | None = None) -> list[Record]:
    """Validated ``cpu-probe`` records, one per measured row (rejected / hung rows have none)."""
    records = []
    for row in probe.rows:
        if not row.measured or row.add_bias_linear:
            continue
        records.append(new_record(
            "cpu-probe",
            workload=workload(recipe=recipe_name(probe.model), model=probe.model, backend="cpu-probe",
                              seq_length=probe.seq_length, micro_batch_size=probe.micro_batch_size,
                              global_batch_size=probe.micro_batch_size, precision="fp32",
                              attention_backend="local", train_iters=None, parallelism=parallelism(),
                              extra={"probe_status": row.status}),
            hardware=hardware(CPU_HARDWARE["device"], CPU_HARDWARE["gpu_count"]),
            recompute=row.fields,
            metrics=row_metrics(row),
            outcome=outcome("completed", message=f"{row.status}: {row.reason}" if row.reason else row.status),
            revisions=revisions,
            record_id=f"{recipe_name(probe.model)}/{row.label}",
        ))
    return records


def write_probe_golden(probe: ModelProbe, root: Path | None = None) -> Path:
    """Write (atomically) the golden for this model and the installed revisions."""
    records = probe_records(probe)
    path = golden_path_for(records, golden_root(root))
    golden = golden_from_records(records, {
        "source": "cpu probe run", "command": REFRESH_COMMAND, "host": socket.gethostname(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": None, "driver": None,
    })
    write_golden(path, golden)
    return path


def check_probe_golden(probe: ModelProbe, root: Path | None = None) -> tuple[Path, list[str]]:
    """(golden path, problems): one readable line per changed value; empty when everything matches."""
    records = probe_records(probe)
    path = golden_path_for(records, golden_root(root))
    if path.is_file():
        problems = _changed_values(compare_records(load_golden(path), records, str(path)))
        return path, problems + ([f"if the change is intended, refresh with: {REFRESH_COMMAND}"] if problems else [])
    problems = [f"no CPU golden {path.name} for these revisions; write it with: {REFRESH_COMMAND}"]
    found = newest_like(path)
    if found is not None:
        # After a Megatron Core bump: show per label what changed against the last pinned golden.
        previous, golden = found
        changed = _changed_values(compare_records(golden, records, str(previous), across_pins=True))
        problems.append(f"against {previous.name} (other revisions): "
                        + (f"{len(changed)} value(s) changed" if changed else "no value changed"))
        problems += changed
    return path, problems


def _changed_values(comparison: Comparison) -> list[str]:
    return [f"{check.label}: {check.metric} {check.golden} -> {check.actual} ({check.verdict})"
            for check in comparison.failures]
