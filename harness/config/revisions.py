"""Which software a verdict, probe or run was measured on: the identity every golden is pinned to.

Megatron Core is described as ``import`` would load it (a ``PYTHONPATH`` checkout, an editable
install or a submodule shadows the installed wheel), not as package metadata claims. Everything here
reads package metadata and files (and asks git for a work tree's commit); nothing imports torch or
Megatron Core, so ``recompute-harness revisions`` answers in well under a second and any module can
call ``collect_revisions()`` freely (results are cached per process).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import platform
import re
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.errors import UsageError

# Which Megatron Core files define recompute semantics is derived from the tree itself, never listed:
# every module that reads a recompute field (where labels are accepted, validated and acted on:
# transformer_config.py, the layers, MoE experts / shared experts, GDN / GDP, hybrid blocks, absorbed
# MLA, recompute.py, ...) or uses the checkpoint machinery (tensor_parallel/random.py, hyper-connections).
FINGERPRINT_PATTERN = re.compile(
    r"\brecompute_(?:modules|granularity|method|num_layers)\b|\bCheckpointWithoutOutput|\bCheckpointFunction\b"
)
# Files the derivation must find (an error when missing, never a skip), always covered: the validator
# and its base class (where the parallelism rules live), and the checkpoint implementations.
REQUIRED_SOURCES: tuple[str, ...] = (
    "transformer/transformer_config.py",
    "model_parallel_config.py",
    "tensor_parallel/random.py",
)

FINGERPRINT_LENGTH = 16  # hex digits kept: short enough for file names, far beyond collision range

# Distribution names tried in order (Transformer Engine ships under several names).
_TE_DISTRIBUTIONS = (
    "transformer-engine",
    "transformer_engine",
    "transformer-engine-cu12",
    "transformer-engine-cu13",
)
_GIT_TIMEOUT_S = 10.0


class IdentityError(UsageError):
    """The Megatron Core that ``import`` loads cannot be identified (no golden may be pinned to it)."""


def _distribution(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _direct_url(dist: metadata.Distribution) -> dict[str, Any]:
    raw = dist.read_text("direct_url.json")
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def vcs_commit(dist: metadata.Distribution) -> str | None:
    """The commit a package was installed from, per PEP 610 ``direct_url.json``; None otherwise."""
    vcs_info = _direct_url(dist).get("vcs_info")
    return vcs_info.get("commit_id") if isinstance(vcs_info, dict) else None


def megatron_core_root() -> Path | None:
    """The ``megatron/core`` directory that ``import megatron.core`` loads (or has loaded).

    Resolved by the import system itself (``sys.path`` order, ``PYTHONPATH`` checkouts, editable-install
    finders), so a second Megatron Core shadowing the installed one is the one described. Finding the
    spec imports at most the ``megatron`` namespace package, never ``megatron.core``.
    """
    loaded = sys.modules.get("megatron.core")
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec("megatron.core")
        except (ImportError, ValueError):
            return None
        origin = None if spec is None else spec.origin
    if not origin:
        return None
    root = Path(origin).resolve().parent
    return root if (root / "transformer").is_dir() else None


def fingerprint_sources(root: Path) -> list[str]:
    """The files (relative to ``root``) the fingerprint covers; ``IdentityError`` when required ones are missing."""
    missing = [relative for relative in REQUIRED_SOURCES if not (root / relative).is_file()]
    if missing:
        raise IdentityError(f"{root} is not a Megatron Core tree: missing {', '.join(missing)}")
    found = []
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise IdentityError(f"{path}: unreadable Megatron Core source ({exc})") from None
        if (
            FINGERPRINT_PATTERN.search(text)
            or path.relative_to(root).as_posix() in REQUIRED_SOURCES
        ):
            found.append(path.relative_to(root).as_posix())
    return found


def source_fingerprint(root: Path | None = None) -> str | None:
    """Digest of the Megatron Core files that define recompute semantics (None when MCore is absent).

    ``root`` is a ``megatron/core`` directory; by default the imported one (computed once). Each file
    contributes its path relative to ``root`` and its bytes, so a rename, a moved rule or an edited
    assertion all change the fingerprint; whitespace-only edits do too, on purpose.
    """
    if root is None:
        return _imported_identity()["fingerprint"]
    return _fingerprint(root)


def _fingerprint(root: Path) -> str:
    digest = hashlib.sha256()
    for relative in fingerprint_sources(root):
        digest.update(relative.encode() + b"\0")
        digest.update((root / relative).read_bytes() + b"\0")
    return digest.hexdigest()[:FINGERPRINT_LENGTH]


def _source_version(root: Path) -> str | None:
    """``MAJOR.MINOR.PATCH`` + ``PRE_RELEASE`` from ``megatron/core/package_info.py``, read as literals.

    The file is never executed: at import it appends ``+<short commit>`` of whatever git repository
    contains it, which for a wheel inside some project's ``.venv`` is that project's commit.
    """
    path = root / "package_info.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    constants: dict[str, Any] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    parts = [constants.get(key) for key in ("MAJOR", "MINOR", "PATCH")]
    if not all(isinstance(part, int) for part in parts):
        return None
    pre = constants.get("PRE_RELEASE", "")
    return ".".join(map(str, parts)) + (pre if isinstance(pre, str) else "")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git_commit(
    root: Path, tracked: str = "transformer/transformer_config.py"
) -> tuple[str | None, str]:
    """(commit, note) of the git work tree whose *tracked* files are ``root`` (submodules, checkouts).

    ``tracked`` is a file under ``root`` that git must track there. A tree with local changes under
    ``root`` has no commit that describes it: (None, why). Files that git does not track there (a wheel
    inside an ignored ``.venv`` of some repository) are not that repository's code: (None, "").
    """
    if _git(root, "ls-files", "--error-unmatch", tracked) is None:
        return None, ""
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return None, ""
    if _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".") != "":
        return (
            None,
            f"git work tree at {commit[:12]} has local changes under {root}: no commit describes it",
        )
    return commit, ""


def tree_identity(path: Path) -> dict[str, Any]:
    """version / commit / fingerprint of a Megatron Core source tree that is not imported: a Megatron-LM
    checkout (or its ``megatron/core``) at some commit, e.g. the commit a study was measured on.

    The commit comes from git and only from a clean work tree, so what the fingerprint covers is
    exactly that commit's code; anything else is ``IdentityError``.
    """
    root = (
        Path(path) / "megatron" / "core"
        if (Path(path) / "megatron" / "core").is_dir()
        else Path(path)
    )
    fingerprint = _fingerprint(root)  # IdentityError when root is not a Megatron Core tree
    commit, note = _git_commit(root)
    if commit is None:
        raise IdentityError(
            f"{root}: {note or 'not a git work tree that tracks these files'}; "
            "check out the commit in a clean git work tree"
        )
    version = _source_version(root)
    if version is None:
        raise IdentityError(f"{root}: no readable package_info.py, so no version")
    return {"version": version, "commit": commit, "fingerprint": fingerprint}


def _owned_by(dist: metadata.Distribution, root: Path) -> bool:
    """Whether ``dist`` installed the code at ``root`` (a regular install, or an editable one of its tree)."""
    located = Path(str(dist.locate_file("megatron/core")))
    if located.is_dir() and located.resolve() == root:
        return True
    url = _direct_url(dist).get("url", "")
    if isinstance(url, str) and url.startswith("file://"):
        source = Path(url.removeprefix("file://")).resolve()
        return root == source / "megatron" / "core"
    return False


@lru_cache(maxsize=1)
def _imported_identity() -> dict[str, Any]:
    """version / commit / fingerprint of the imported MCore, plus the metadata's view and any notes."""
    root = megatron_core_root()
    dist = _distribution("megatron-core")
    package_version = None if dist is None else dist.version
    package_commit = None if dist is None else vcs_commit(dist)
    package = None if dist is None else {"version": package_version, "commit": package_commit}
    if root is None:
        return {
            "root": None,
            "version": None,
            "commit": None,
            "fingerprint": None,
            "package": package,
            "notes": ["megatron.core is not importable"],
        }
    notes: list[str] = []
    owned = dist is not None and _owned_by(dist, root)
    version = _source_version(root) or (package_version if owned else None)
    commit = package_commit if owned and package_commit else None
    if commit is None:
        commit, note = _git_commit(root)
        notes += [note] if note else []
    try:
        fingerprint = _fingerprint(root)
    except IdentityError as exc:
        fingerprint = None
        notes.append(str(exc))
    # A source build's metadata carries a local "+<commit>" suffix: the same release, not a disagreement.
    disagrees = package_version is not None and (
        not owned or package_version.split("+")[0] != version
    )
    if disagrees:
        notes.append(
            f"package metadata says megatron-core {package_version} (commit {package_commit}) "
            f"but import loads {version} from {root}"
        )
    return {
        "root": str(root),
        "version": version,
        "commit": commit,
        "fingerprint": fingerprint,
        "package": package if disagrees else None,
        "notes": notes,
    }


def megatron_core_identity() -> dict[str, Any]:
    """The imported Megatron Core: root, version, commit, fingerprint, ``package`` (the metadata's
    version and commit, only when they disagree with the imported code) and human-readable notes."""
    return json.loads(json.dumps(_imported_identity()))


def identity_problem() -> str | None:
    """Why no golden or manifest may be pinned to the imported Megatron Core; None when it can be."""
    identity = _imported_identity()
    if identity["root"] is None:
        return "megatron.core is not importable: nothing to pin a golden to"
    missing = [key for key in ("version", "fingerprint") if identity[key] is None]
    if missing:
        why = "; ".join(identity["notes"]) or "no package_info.py and no package metadata for it"
        return (
            f"the Megatron Core imported from {identity['root']} has no {' or '.join(missing)} ({why}): "
            "refusing to pin a golden to it"
        )
    return None


def require_identity() -> None:
    """Raise ``IdentityError`` (exit 2, one line) unless the imported MCore can carry a golden."""
    problem = identity_problem()
    if problem is not None:
        raise IdentityError(problem)


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
    if spec is None or spec.loader is None:
        return None
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


def _package(name: str, module: str | None = None) -> dict[str, Any] | None:
    """version and commit of an installed distribution. Without a PEP 610 commit, the commit of the git
    work tree that tracks ``module``'s imported files (an editable or source install in a container)."""
    dist = _distribution(name)
    if dist is None:
        return None
    commit = vcs_commit(dist)
    if commit is None and module is not None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            commit, _ = _git_commit(Path(spec.origin).resolve().parent, tracked="__init__.py")
    return {"version": dist.version, "commit": commit}


@lru_cache(maxsize=1)
def _collect() -> dict[str, Any]:
    torch = _distribution("torch")
    identity = _imported_identity()
    megatron_core = None
    if identity["root"] is not None:
        megatron_core = {key: identity[key] for key in ("version", "commit", "fingerprint")}
        if identity["package"] is not None:
            megatron_core["package"] = identity[
                "package"
            ]  # the metadata's claim, kept next to the truth
    te = next((d for d in map(_distribution, _TE_DISTRIBUTIONS) if d is not None), None)
    return {
        "torch": None if torch is None else torch.version,
        "megatron_core": megatron_core,
        "megatron_bridge": _package("megatron-bridge", "megatron.bridge"),
        "transformer_engine": None if te is None else te.version,
        "cuda": _torch_cuda_version(),
        "driver": _driver_version(),
        "python": platform.python_version(),
    }


def collect_revisions() -> dict[str, Any]:
    """The ``revisions`` block of a run record (absent packages as None). A fresh copy each call."""
    return json.loads(json.dumps(_collect()))
