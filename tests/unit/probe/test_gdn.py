"""``gdn_norm_out`` is measured: on gdn-tiny (MCore's Gated DeltaNet on the CPU stand-ins of its fla
kernels) its output-discard checkpoint keeps less than the ``[]`` control, and replays bit for bit."""

from __future__ import annotations

from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state
from harness.probe import runner
from harness.probe.measurement.status import EFFECTIVE
from harness.probe.plan import ProbeRow


def test_gdn_norm_out_is_effective_on_gdn_tiny():
    init_cpu_parallel_state(seed=1234)
    base = runner.baseline("gdn-tiny")
    row = runner.measure_row("gdn-tiny", ProbeRow(RecomputeFields.selective("gdn_norm_out")), base)
    assert row.status == EFFECTIVE, row.reason
    assert row.retained_bytes is not None
    assert row.retained_bytes < base.fp32.retained_bytes
    assert row.equivalence is not None and row.equivalence.bitwise
    assert row.dropout_equivalence is not None and row.dropout_equivalence.bitwise
