"""A probe that deadlocks is reported as a hang and its process group is killed; nothing waits on it."""

from __future__ import annotations

import os

from harness.config.fields import RecomputeFields
from harness.probe.isolate import IsolatedProbe
from harness.probe.plan import ProbeRow


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_isolated_rows_hang_or_complete():
    # MCore 0.19.2 deadlocks in CheckpointFunction.backward for selective `mlp` with biases. When an
    # upstream fix lands this test fails: the row then completes, and the probe should report it.
    # Both children run at once (the probe starts them before its in-process rows, too).
    hanging = IsolatedProbe("dense-tiny", ProbeRow(RecomputeFields.selective("mlp"), add_bias_linear=True),
                            timeout_s=3)
    finishing = IsolatedProbe("dense-tiny", ProbeRow(RecomputeFields.selective("core_attn")), timeout_s=60)

    hung = hanging.outcome()
    assert hung.status == "hang" and "3 s into measurement; process group killed" in hung.message
    assert not _alive(hanging.process.pid)

    done = finishing.outcome()
    assert done.status == "completed", done.message
    assert done.payload["status"] == "effective" and done.payload["equivalence"]["differing_grads"] == 0
