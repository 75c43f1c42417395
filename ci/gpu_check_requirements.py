"""What ci/gpu-check-h200.sh needs on the machine it runs on, said in one line (stdlib only: the device
image has no package index and perhaps not even `packaging`).

    python3 ci/gpu_check_requirements.py WHEEL_DIR [--cpu]   the check
    python3 ci/gpu_check_requirements.py --pins              the carried pins, for pip install

Checks: Python 3.12 (the project's requires-python); torch at or above the project's lower bound
(pyproject.toml); each carried distribution installed at exactly its version in the lock
(ci/constraints-cpu.txt), or that exact wheel in WHEEL_DIR; every carried wheel's platform tag usable
here (its CPU architecture, a manylinux glibc no newer than this one); CUDA visible (not with --cpu).
Prints `requirements: ok` and exits 0, or `requirements: missing: A; B; ...` and exits 2.

A C++ compiler, ninja and Python's headers are only what Megatron Core's `share_storage_ext` needs
(compiled by torch's load_inline the first time `mla_up_proj` runs): without them the check still
passes, saying `requirements: ok; no extension toolchain (...)`, and the script runs every other row,
reporting mla_up_proj as requires-extension.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "ci" / "constraints-cpu.txt"
# Distributions the script installs from the carried wheels when they are not installed already.
CARRIED = ("megatron-core", "rich", "matplotlib")
EXTENSION_NOTE = "no extension toolchain"


def release(version: str) -> tuple[int, ...]:
    """``2.14.1+cu130`` -> (2, 14, 1): the release segment, enough to order the pins used here."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def lower_bound(name: str) -> str | None:
    """The version of ``name``'s ``>=`` bound in pyproject.toml's dependencies (e.g. torch's 2.6)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for line in project["dependencies"]:
        match = re.fullmatch(rf"{re.escape(name)}\s*>=\s*([\w.]+).*", line.strip())
        if match:
            return match.group(1)
    return None


def locked(name: str) -> str:
    """The exact version of ``name`` in the lock (ci/constraints-cpu.txt)."""
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(rf"{re.escape(name)}==([\w.+]+)", line.strip())
        if match:
            return match.group(1)
    raise SystemExit(f"gpu_check_requirements.py: {name} is not pinned in {LOCK}")


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def glibc() -> tuple[int, int] | None:
    name, version = platform.libc_ver()
    parts = re.findall(r"\d+", version)
    return (int(parts[0]), int(parts[1])) if name == "glibc" and len(parts) >= 2 else None


def unusable_platform(wheel: Path) -> str | None:
    """Why ``wheel`` cannot install here (its platform tag), or None. ``py3-none-any`` goes anywhere; a
    ``manylinux_X_Y_ARCH`` (or legacy ``manylinux2014_ARCH`` = 2.17) needs ARCH and glibc >= X.Y."""
    tags = wheel.name[: -len(".whl")].split("-")[-1].split(".")
    machine, libc = platform.machine(), glibc()
    for tag in tags:
        if tag == "any":
            return None
        match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)|manylinux2014_(\w+)", tag)
        if match is None:
            continue
        needed = (int(match[1]), int(match[2])) if match[1] else (2, 17)
        arch = match[3] or match[4]
        if arch == machine and libc is not None and libc >= needed:
            return None
    libc_text = "no glibc" if libc is None else f"glibc {libc[0]}.{libc[1]}"
    return f"{wheel.name} (platform {'.'.join(tags)}; this machine: {machine}, {libc_text})"


def missing(wheels: Path, cpu: bool) -> list[str]:
    problems = []
    if sys.version_info[:2] != (3, 12):
        problems.append(f"Python 3.12 (found {sys.version.split()[0]})")
    torch_bound = lower_bound("torch")
    torch_version = installed("torch")
    if torch_version is None:
        problems.append("torch (not installed)")
    elif torch_bound is not None and release(torch_version) < release(torch_bound):
        problems.append(f"torch>={torch_bound} (pyproject; found {torch_version})")
    for name in CARRIED:
        pin, have = locked(name), installed(name)
        if have == pin:
            continue
        wheel = sorted(wheels.glob(f"{name.replace('-', '_')}-{pin}-*.whl"))
        found = f"installed {have}" if have else "not installed"
        if not wheel:
            problems.append(
                f"{name}=={pin} ({found}, no {wheels}/{name.replace('-', '_')}-{pin}-*.whl)"
            )
        elif (why := unusable_platform(wheel[0])) is not None:
            problems.append(
                f"{name}=={pin} ({found}; the carried wheel cannot install here: {why})"
            )
    for wheel in sorted(wheels.glob("*.whl")):
        if (why := unusable_platform(wheel)) is not None and not any(
            wheel.name.startswith(f"{name.replace('-', '_')}-") for name in CARRIED
        ):
            problems.append(f"a usable carried wheel: {why}")
    if not cpu:
        try:
            import torch

            if not torch.cuda.is_available():
                problems.append("a CUDA GPU (torch.cuda.is_available() is False)")
        except Exception as exc:  # a torch that cannot load its CUDA libraries  # noqa: BLE001
            problems.append(f"an importable torch ({type(exc).__name__}: {exc})".splitlines()[0])
    return problems


def toolchain_gaps() -> list[str]:
    """What Megatron Core's share_storage_ext (mla_up_proj only) cannot be built without."""
    gaps = []
    if not (shutil.which("g++") or shutil.which("c++")):
        gaps.append("g++")
    if not shutil.which("ninja"):
        gaps.append("ninja")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        gaps.append("Python.h (python3-dev)")
    return gaps


def main(argv: list[str]) -> int:
    if argv == ["--pins"]:
        print(" ".join(f"{name}=={locked(name)}" for name in CARRIED))
        return 0
    if not argv or argv[0].startswith("-"):
        print("usage: gpu_check_requirements.py WHEEL_DIR [--cpu] | --pins", file=sys.stderr)
        return 2
    problems = missing(Path(argv[0]), cpu="--cpu" in argv[1:])
    if problems:
        print(f"requirements: missing: {'; '.join(problems)}")
        return 2
    gaps = toolchain_gaps()
    print(
        "requirements: ok"
        + (
            f"; {EXTENSION_NOTE} ({', '.join(gaps)}): mla_up_proj is requires-extension"
            if gaps
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
