"""What ci/gpu-check-h200.sh needs on the machine it runs on, said in one line (stdlib only: the device
image has no package index and perhaps not even `packaging`).

    python3 ci/gpu_check_requirements.py WHEEL_DIR [--cpu]

Checks: Python 3.12 (the project's requires-python); torch at or above the project's lower bound
(pyproject.toml); each carried distribution either installed at its pinned version or present as a
wheel in WHEEL_DIR; CUDA visible (not with --cpu); a C++ compiler, ninja and Python's headers, which
Megatron Core's `share_storage_ext` (compiled by torch's load_inline the first time `mla_up_proj`
runs) needs. Prints `requirements: ok` and exits 0, or `requirements: missing: A; B; ...` and exits 2.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Distributions the script installs from the carried wheels when they are not installed already.
CARRIED = ("megatron-core", "rich", "matplotlib")


def release(version: str) -> tuple[int, ...]:
    """``2.14.1+cu130`` -> (2, 14, 1): the release segment, enough to order the pins used here."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def requirement(name: str) -> tuple[str, str] | None:
    """(operator, version) of ``name``'s pin in pyproject.toml's dependencies, e.g. ("==", "2.14.1")."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for line in project["dependencies"]:
        match = re.fullmatch(rf"{re.escape(name)}\s*(==|>=|~=)\s*([\w.]+).*", line.strip())
        if match:
            return match.group(1), match.group(2)
    return None


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing(wheels: Path, cpu: bool) -> list[str]:
    problems = []
    if sys.version_info[:2] != (3, 12):
        problems.append(f"Python 3.12 (found {sys.version.split()[0]})")
    torch_pin = requirement("torch")
    torch_version = installed("torch")
    if torch_version is None:
        problems.append("torch (not installed)")
    elif torch_pin is not None and release(torch_version) < release(torch_pin[1]):
        problems.append(
            f"torch>={torch_pin[1]} (pyproject: torch{''.join(torch_pin)}; found {torch_version})"
        )
    for name in CARRIED:
        pin = requirement(name)
        have = installed(name)
        if have is not None and (pin is None or pin[0] != "==" or release(have) == release(pin[1])):
            continue
        stem = name.replace("-", "_")
        pattern = (
            f"{stem}-{pin[1]}-*.whl" if pin is not None and pin[0] == "==" else f"{stem}-*.whl"
        )
        if not list(wheels.glob(pattern)):
            found = f"installed {have}" if have else "not installed"
            problems.append(f"{name}{''.join(pin or ())} ({found}, no {wheels}/{pattern})")
    if not cpu:
        try:
            import torch

            if not torch.cuda.is_available():
                problems.append("a CUDA GPU (torch.cuda.is_available() is False)")
        except Exception as exc:  # a torch that cannot load its CUDA libraries  # noqa: BLE001
            problems.append(f"an importable torch ({type(exc).__name__}: {exc})".splitlines()[0])
    share_storage = "for Megatron Core's share_storage_ext (mla_up_proj)"
    if not (shutil.which("g++") or shutil.which("c++")):
        problems.append(f"g++ {share_storage}")
    if not shutil.which("ninja"):
        problems.append(f"ninja {share_storage}")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        problems.append(f"Python.h (python3-dev) {share_storage}")
    return problems


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: gpu_check_requirements.py WHEEL_DIR [--cpu]", file=sys.stderr)
        return 2
    problems = missing(Path(argv[0]), cpu="--cpu" in argv[1:])
    print("requirements: ok" if not problems else f"requirements: missing: {'; '.join(problems)}")
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
