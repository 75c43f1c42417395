"""Safe file I/O: every file the harness writes appears whole or not at all, never over a file it
did not write unless asked, and every file it reads is a bounded regular file.

The content goes to a temporary file in the target directory, is fsynced, and is moved into place
with ``os.replace`` (then the directory is fsynced), so a reader never sees a half-written file and
an error never loses the old one. A symlinked target is written through: the link stays a link.
Temporary files of a target are removed on every exit path, and those a killed writer left behind
are swept before the next write of the same target. Every failure is one ``UsageError`` line.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.errors import UsageError

# Inputs (records, goldens, manifests) are kilobytes; the limit keeps `--golden /dev/zero`-like
# mistakes from eating the machine's memory.
MAX_INPUT_BYTES = 64 * 1024 * 1024
HEAD_BYTES = 4096  # how much of an existing output is read to recognise it as our own


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def sweep_temps(path: Path) -> None:
    """Remove temporary files a killed writer of ``path`` left beside it."""
    for stale in Path(path).parent.glob(f"{_temp_prefix(Path(path))}*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _target(path: Path) -> Path:
    """Where the bytes go: a symlink's target (the link itself is kept), else ``path``."""
    return Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)


def ensure_dir(directory: Path) -> Path:
    """Create ``directory`` (and parents); any failure is one line."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{directory}: exists and is not a directory") from None
    except (OSError, UnicodeError) as exc:
        raise UsageError(
            f"{directory}: cannot create directory: {exc.strerror if isinstance(exc, OSError) else exc}"
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{directory}: directory is not writable")
    return directory


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; moved onto ``path`` on success, removed on error."""
    path = _target(Path(path))
    ensure_dir(path.parent)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory")
    sweep_temps(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.chmod(
            tmp, 0o666 & ~_umask()
        )  # mkstemp makes 0600; the file should get the usual permissions
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        yield Path(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except UnicodeError as exc:
        raise UsageError(f"{path}: cannot write: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
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


def check_output(path: Path, force: bool, is_own: Callable[[bytes], bool], what: str) -> None:
    """Refuse (before anything runs) an output path that is a directory, or an existing file that is
    not this command's own previous output (``is_own`` judges its first bytes), unless ``force``."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; name a file for the {what}")
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"{path.parent}: exists and is not a directory")
    if not path.exists() or force:
        return
    try:
        with open(path, "rb") as handle:
            head = (
                handle.read(HEAD_BYTES) if stat.S_ISREG(os.fstat(handle.fileno()).st_mode) else b""
            )
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    if not is_own(head):
        raise UsageError(
            f"{path}: exists and is not a {what} this command wrote; refusing to overwrite it "
            "(pass --force to replace it)"
        )


def read_bounded_text(path: Path, limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes; anything else is one line."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path}: is a directory")
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block forever, a device could be endless
        raise UsageError(f"{path}: not a regular file")
    if info.st_size > limit:
        raise UsageError(
            f"{path}: {info.st_size} bytes, larger than the {limit // (1024 * 1024)} MiB input limit"
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > limit:
        raise UsageError(f"{path}: larger than the {limit // (1024 * 1024)} MiB input limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path}: cannot read: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
