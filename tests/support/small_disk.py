"""A small filesystem of a test's own, for what a full disk does to the harness: a tmpfs mounted in a
private mount namespace (util-linux ``unshare``; as root, or in an unprivileged user namespace), so
nothing outside the test's shell sees it and nothing is left mounted when the shell ends."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# Inside the script: $DISK is the mount point; `fill_disk` writes zeros until the filesystem is full.
_PREAMBLE = """set -u
mount -t tmpfs -o size={size}m tmpfs "$DISK" || exit 77
fill_disk() {{ dd if=/dev/zero of="$DISK/.filler" bs=64k 2>/dev/null; return 0; }}
"""


def run_on_small_disk(
    disk: Path,
    script: str,
    *,
    size_mib: int = 8,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run the bash ``script`` with a fresh ``size_mib`` MiB tmpfs mounted on ``disk`` (an existing, empty
    directory), in ``env`` (default: this process's environment); skips the test where no such mount can
    be made."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare to mount a small filesystem")
    result = subprocess.run(
        [
            "unshare",
            "--map-root-user",
            "--mount",
            "bash",
            "-c",
            _PREAMBLE.format(size=size_mib) + script,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**(os.environ if env is None else env), "DISK": str(disk)},
        check=False,
    )
    if result.returncode == 77 or result.stderr.startswith("unshare:"):
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    return result
