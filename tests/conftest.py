"""Shared test set-up: Hypothesis profiles, the CPU adapter's deferred ``torch.compile``. Markers and the ``recompute_golden`` fixture come from the
harness's own pytest plugin (harness/pytest_plugin.py), as in any repo that uses it."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

from harness.cpu.deferred_compile import defer_compile_before_megatron_core

# Torch's JIT extension cache where ./venv-run builds Megatron Core's share_storage_ext (~28 s of g++)
# when it creates the venv: beside the venv. A bare `.venv/bin/pytest` (an IDE, a CI calling the venv
# directly) would otherwise build it again under ~/.cache, in every process that first needs it. Set
# before any test, so xdist workers, probe children and torchrun ranks inherit it.
if sys.prefix != sys.base_prefix:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))

# Commands that write a report file by default (probe's tables, harness.report.summary) write it here,
# not into the checkout's runs/: one directory per test session, inherited by subprocesses.
if "RECOMPUTE_HARNESS_REPORT_DIR" not in os.environ:
    os.environ["RECOMPUTE_HARNESS_REPORT_DIR"] = tempfile.mkdtemp(
        prefix="recompute-harness-reports-"
    )
    atexit.register(shutil.rmtree, os.environ["RECOMPUTE_HARNESS_REPORT_DIR"], True)

# The test processes import Megatron Core as the CLI and the workers do: with the CPU adapter's part 4.
defer_compile_before_megatron_core()

# HYPOTHESIS_PROFILE=ci (default: derandomized, no deadline) | dev | nightly (>=100k examples/property)
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=200,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=500)
settings.register_profile(
    "nightly", deadline=None, max_examples=100_000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Slow tests first. The GPU check script's CPU rehearsal (``rehearsal``, ~80 s of CPU) is .ci/run's own second step:
    it runs only when asked for by name (``-m rehearsal``), so the CPU tier keeps its time budget."""
    import pytest

    # Longest first (slow: they launch torchrun / subprocesses): --dist loadscope hands modules out in
    # this order, so the 2 workers end together instead of one finishing a long sweep alone. A stable
    # sort: a module keeps its own order.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    asked = config.getoption("markexpr") or ""
    for marker, step in (
        (
            "rehearsal",
            "the GPU-check rehearsal runs as its own step: pytest -m rehearsal (.ci/run)",
        ),
        ("layouts", "the multi-process probes run as their own step: pytest -m layouts (.ci/run)"),
        ("sweeps", "the torchrun sweeps run as their own step: pytest -m sweeps (.ci/run)"),
        (
            "revisions",
            "the released revisions run as their own step: pytest -m revisions (.ci/run)",
        ),
        ("unreleased", "unreleased trees run as their own step: pytest -m unreleased (.ci/run)"),
        (
            "estimates",
            "the full-width estimates run as their own step: pytest -m estimates (.ci/run)",
        ),
    ):
        if marker in asked:
            continue
        skip = pytest.mark.skip(reason=step)
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
