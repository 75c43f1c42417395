"""A real git work tree holding the installed Megatron Core's recompute sources, as a source checkout
(Bridge's ``3rdparty/Megatron-LM`` submodule, an editable install) would hold them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from harness.config.revisions import fingerprint_sources, megatron_core_root

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def copy_sources(root: Path, target: Path) -> None:
    """The files the fingerprint covers, from ``root`` into ``target`` (a tree with the same fingerprint)."""
    for relative in fingerprint_sources(root):
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / relative, target / relative)


def mcore_checkout(tmp_path: Path) -> Path:
    """``tmp_path/Megatron-LM``: a git repository at one commit, ``megatron/core`` holding the sources."""
    root = megatron_core_root()
    assert root is not None, "megatron.core is not importable"
    repo = tmp_path / "Megatron-LM"
    core = repo / "megatron" / "core"
    copy_sources(root, core)
    for name in ("__init__.py", "package_info.py"):
        shutil.copy(root / name, core / name)
    env = {**os.environ, **_GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "checkout"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)
    return repo


def git_head(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
