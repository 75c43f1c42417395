"""Megatron-LM's own sources for the tests that read them: the git repository (skipped, saying what to
set, where none is at hand) and this repository's scripts of ci/ and benchmarks/ that read it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from overlays import ENABLE_HEAD, MEGATRON_LM_GIT


def script(name: str) -> ModuleType:
    """A script of ci/ or benchmarks/ as a module (they are no package)."""
    root = Path(__file__).resolve().parents[2]
    folder = "ci" if name.startswith("megatron_lm_flags") else "benchmarks"
    spec = importlib.util.spec_from_file_location(name, root / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mirror_or_skip() -> str:
    """The Megatron-LM git repository's path, or a skip naming what to set."""
    if not (MEGATRON_LM_GIT / "objects").is_dir() and not (MEGATRON_LM_GIT / ".git").is_dir():
        pytest.skip(f"no Megatron-LM git repository at {MEGATRON_LM_GIT}: {ENABLE_HEAD}")
    return str(MEGATRON_LM_GIT)
