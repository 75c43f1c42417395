"""Which software a verdict, probe or run was measured on: the identity every golden is pinned to.

Everything here reads package metadata and files; nothing imports torch or Megatron Core, so
``recompute-harness revisions`` answers in well under a second and any module can call
``collect_revisions()`` freely (results are cached per process).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

# The Megatron Core sources that define recompute semantics, relative to ``megatron/core``. A
# directory stands for every ``.py`` file under it. ``recompute.py`` holds ``checkpointed_forward``
# (full recompute) since 0.19; older trees keep it in transformer_block.py, which is listed too.
FINGERPRINT_SOURCES: tuple[str, ...] = (
    "transformer/transformer_config.py",
    "transformer/transformer_layer.py",
    "transformer/transformer_block.py",
    "transformer/attention.py",
    "transformer/multi_latent_attention.py",
    "transformer/moe/experts.py",
    "transformer/moe/moe_layer.py",
    "tensor_parallel/random.py",
    "ssm/gated_delta_net",
    "recompute.py",
)

FINGERPRINT_LENGTH = 16  # hex digits kept: short enough for file names, far beyond collision range

# Distribution names tried in order (Transformer Engine ships under several names).
_TE_DISTRIBUTIONS = ("transformer-engine", "transformer_engine", "transformer-engine-cu12", "transformer-engine-cu13")


def _distribution(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def vcs_commit(dist: metadata.Distribution) -> str | None:
    """The commit a package was installed from, per PEP 610 ``direct_url.json``; None otherwise."""
    raw = dist.read_text("direct_url.json")
    if not raw:
        return None
    try:
        vcs_info = json.loads(raw).get("vcs_info") or {}
    except (json.JSONDecodeError, AttributeError):
        return None
    return vcs_info.get("commit_id")


def megatron_core_root() -> Path | None:
    """The installed ``megatron/core`` directory, located without importing it."""
    dist = _distribution("megatron-core")
    if dist is not None:
        root = Path(str(dist.locate_file("megatron/core")))
        if root.is_dir():
            return root
    # Source checkouts on sys.path (editable installs without metadata, PYTHONPATH=Megatron-LM).
    for entry in sys.path:
        root = Path(entry or ".") / "megatron" / "core"
        if (root / "transformer" / "transformer_config.py").is_file():
            return root
    return None


def _fingerprint_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for relative in FINGERPRINT_SOURCES:
        path = root / relative
        if path.is_dir():
            files.extend(sorted(path.rglob("*.py")))
        elif path.is_file():
            files.append(path)
    return files


def source_fingerprint(root: Path | None = None) -> str | None:
    """Digest of the Megatron Core files that define recompute semantics (None when MCore is absent).

    ``root`` is a ``megatron/core`` directory; by default the installed one (computed once). Each file
    contributes its path relative to ``root`` and its bytes, so a rename, a moved rule or an edited
    assertion all change the fingerprint; whitespace-only edits do too, on purpose.
    """
    return _installed_fingerprint() if root is None else _fingerprint(root)


@lru_cache(maxsize=1)
def _installed_fingerprint() -> str | None:
    root = megatron_core_root()
    return None if root is None else _fingerprint(root)


def _fingerprint(root: Path) -> str:
    digest = hashlib.sha256()
    for path in _fingerprint_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:FINGERPRINT_LENGTH]


def _torch_cuda_version() -> str | None:
    """CUDA version torch was built with, read from ``torch/version.py`` without importing torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.version.cuda
    dist = _distribution("torch")
    if dist is None:
        return None
    version_file = Path(str(dist.locate_file("torch/version.py")))
    if not version_file.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_harness_torch_version", version_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a file of constants; importing it does not import torch
    return getattr(module, "cuda", None)


def _driver_version() -> str | None:
    """NVIDIA kernel driver version, or None on a machine without one."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(part.isdigit() for part in parts):
            return word
    return None


def _package(name: str) -> dict[str, str | None] | None:
    dist = _distribution(name)
    if dist is None:
        return None
    return {"version": dist.version, "commit": vcs_commit(dist)}


@lru_cache(maxsize=1)
def _collect() -> dict[str, Any]:
    torch = _distribution("torch")
    megatron_core = _package("megatron-core")
    if megatron_core is not None:
        megatron_core["fingerprint"] = source_fingerprint()
    te = next((d for d in map(_distribution, _TE_DISTRIBUTIONS) if d is not None), None)
    return {
        "torch": None if torch is None else torch.version,
        "megatron_core": megatron_core,
        "megatron_bridge": _package("megatron-bridge"),
        "transformer_engine": None if te is None else te.version,
        "cuda": _torch_cuda_version(),
        "driver": _driver_version(),
        "python": platform.python_version(),
    }


def collect_revisions() -> dict[str, Any]:
    """The ``revisions`` block of a run record (absent packages as None). A fresh copy each call."""
    return json.loads(json.dumps(_collect()))
