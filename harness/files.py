"""Atomic file writes: every file the harness writes appears whole or not at all.

The content goes to a temporary file in the target directory and is moved into place with
``os.replace``, so a reader never sees a half-written file and an error never loses the old one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.errors import UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; moved onto ``path`` on success, removed on error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the file should get the usual permissions
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` (fsynced; ``mode`` sets permissions, e.g. 0o755 for a script)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON; NaN/inf are refused (they are invalid in harness files)."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    except ValueError as exc:
        raise UsageError(f"{path}: refusing to write: {exc}") from None
    write_text_atomic(path, text)


def require_writable_dir(directory: Path) -> None:
    """``UsageError`` unless ``directory`` (or the nearest existing parent it would be made in) is writable.

    Checked before work whose result is to be written, so that a read-only golden directory is refused
    up front rather than after minutes of probing.
    """
    existing = Path(directory)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{directory}: not a writable directory; nothing was written")
