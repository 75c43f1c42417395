"""A probe that deadlocks is reported as a hang and its process group is killed; nothing waits on it."""

from __future__ import annotations

import os

from harness.config.fields import RecomputeFields
from harness.probe.isolate import IsolatedProbe
from harness.probe.plan import ProbeRow


def test_selective_mlp_with_biases_is_reported_as_hang():
    # MCore 0.19.2 deadlocks in CheckpointFunction.backward for selective `mlp` with biases. When an
    # upstream fix lands this test fails: the row then completes, and the probe reports it measured.
    # The child's start-up (torch + MCore import) has its own, generous limit: a loaded CI box is slow.
    probe = IsolatedProbe("dense-tiny", ProbeRow(RecomputeFields.selective("mlp"), add_bias_linear=True),
                          timeout_s=3)
    outcome = probe.outcome()
    assert outcome.status == "hang", outcome.message
    assert outcome.message == "no result 3 s into measurement; process group killed"
    try:
        os.killpg(probe.process.pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
