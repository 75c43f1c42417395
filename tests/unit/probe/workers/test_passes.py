"""Probe passes on worker processes (``probe --jobs N``): the same probes as one process, in the same
order; a worker that dies fails the probe by name and takes the other workers with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from marked_processes import MARKER_ENV, marked_processes

from harness.probe.present.table import probe_json
from harness.probe.workers.passes import probe_passes

# Worker processes each import torch and Megatron Core (~6 s of CPU): .ci/run's "layouts" step.
pytestmark = [pytest.mark.slow, pytest.mark.layouts]


def test_passes_on_workers_are_the_passes_of_one_process():
    # Both attention back ends from one queue of passes: what a tree without goldens of its own runs.
    options = {
        "label_sets": [("core_attn",)],
        "hang_probe": False,
        "backends": ("unfused", "fused"),
    }
    passes = (["dense-tiny", "mtp-tiny"], ["fp32", "bf16"])
    on_workers = probe_passes(*passes, jobs=2, **options)
    in_process = probe_passes(*passes, jobs=1, **options)
    assert [(probe.model, probe.precision, probe.attention_backend) for probe in on_workers] == [
        (model, precision, backend)
        for backend in ("unfused", "fused")
        for precision in ("fp32", "bf16")
        for model in ("dense-tiny", "mtp-tiny")
    ]
    assert [probe_json(probe) for probe in on_workers] == [
        probe_json(probe) for probe in in_process
    ]


def _workers(marker: str) -> list[int]:
    return marked_processes(marker, "harness.probe.workers.pass_worker")


def test_a_killed_worker_fails_the_probe_by_name_and_the_other_worker_goes_too():
    marker = uuid.uuid4().hex
    probe = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "probe", "--model", "dense-tiny"]
        + ["--modules", "core_attn", "--jobs", "2"],
        env={**os.environ, MARKER_ENV: marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(_workers(marker)) < 2 and probe.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _workers(marker)
        assert len(workers) == 2, f"the workers never started: {probe.communicate()}"
        os.kill(workers[0], signal.SIGKILL)
        out, err = probe.communicate(timeout=120)
        assert probe.returncode == 1, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("recompute-harness: error: the probe worker of dense-tiny (")
        assert "died, exit -9" in last
        assert "| `core_attn` |" not in out  # nothing half-reported
        assert not _workers(marker)
    finally:
        probe.kill()
        for pid in _workers(marker):
            os.kill(pid, signal.SIGKILL)
