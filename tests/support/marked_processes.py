"""Find a test's own processes: it starts them with ``MARKER_ENV`` set to a fresh marker, which every
descendant inherits, so another test's (or another run's) processes are never counted or killed."""

from __future__ import annotations

import contextlib
from pathlib import Path

from harness.processes import processes_with_env

MARKER_ENV = "RECOMPUTE_HARNESS_TEST_MARKER"


def marked_processes(marker: str, module: str) -> list[int]:
    """Live processes carrying ``marker`` whose command line runs ``module`` (``python -m module``)."""
    found = []
    for pid in processes_with_env(MARKER_ENV, marker):
        with contextlib.suppress(OSError):
            if module.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found
