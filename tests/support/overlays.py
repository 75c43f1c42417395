"""Released megatron-core wheels overlaid next to the venv, for rehearsing a Megatron Core bump for real.

Each overlay is ``pip install --no-deps --target`` of a small megatron-core wheel (torch is reused),
cached outside the repository (``$RECOMPUTE_HARNESS_OVERLAYS`` or ``~/.cache/recompute-harness/
overlays``), so reruns cost no download. ``./venv-run`` fetches them when it creates the venv
(``python tests/support/overlays.py``): set-up, not the CPU tier's time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# The bump rehearsals of tests/unit/commands/test_bump.py: a release without gdn_norm_out, and a patch
# release of the pinned minor.
BUMP_REHEARSALS = ("0.18.2", "0.19.0")
OVERLAYS = Path(
    os.environ.get(
        "RECOMPUTE_HARNESS_OVERLAYS", Path.home() / ".cache" / "recompute-harness" / "overlays"
    )
)
PIP_TIMEOUT_S = 300


def overlay(version: str) -> Path:
    """``megatron-core==version`` installed (once) into its own target directory."""
    target = OVERLAYS / f"megatron-core-{version}"
    if (target / f"megatron_core-{version}.dist-info").is_dir():
        return target
    staging = OVERLAYS / f".megatron-core-{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(staging),
            f"megatron-core=={version}",
        ],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"cannot install the megatron-core {version} overlay:\n{done.stderr[-2000:]}"
        )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # a complete overlay or none: an interrupted install is redone
    return target


if __name__ == "__main__":
    for version in BUMP_REHEARSALS:
        overlay(version)
