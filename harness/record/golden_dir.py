"""Where goldens live, and which golden a set of records is judged by.

One root holds every kind of golden: run and reference goldens at the top, CPU-probe goldens under
``cpu/``, label manifests under ``labels/``, CPU estimates of GPU recipes under ``estimate/``. The root
is, in order: the command's ``--golden-dir``, ``$RECOMPUTE_HARNESS_GOLDEN_DIR``, else ``tests/golden`` of
this checkout, else (an installed, non-editable package) the copy shipped as package data in
``harness/data/golden``. Every command and test finds goldens here and nowhere else.

In the repository ``harness/data/golden`` is a symlink to ``tests/golden`` (the source of truth), so a
wheel carries the label manifests and CPU goldens of the pinned revisions without a second copy. The
shipped copy is read-only: a write into it is refused (see ``writable``), so nothing ever writes into
site-packages; name a directory with ``--golden-dir`` or the environment variable instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.errors import UsageError
from harness.record.golden import Golden, golden_filename_for, load_golden, recipe_slug
from harness.record.model import Record

ENV_VAR = "RECOMPUTE_HARNESS_GOLDEN_DIR"
CHECKOUT_ROOT = Path(__file__).resolve().parents[2] / "tests" / "golden"
PACKAGED_ROOT = Path(__file__).resolve().parents[1] / "data" / "golden"
CPU_SUBDIR = "cpu"
LABELS_SUBDIR = "labels"
ESTIMATE_SUBDIR = "estimate"  # `estimate --write-golden` files (not run goldens: harness.estimate)


def golden_root(option: Path | str | None = None) -> Path:
    """The golden root: ``option``, else the environment variable, else the checkout's tests/golden."""
    for value, what in ((option, "--golden-dir"), (os.environ.get(ENV_VAR), ENV_VAR)):
        if value is None:
            continue
        if str(value) == "":
            raise UsageError(f"{what} is empty; name a golden directory")
        return Path(value)
    return CHECKOUT_ROOT if in_checkout() else PACKAGED_ROOT


def in_checkout() -> bool:
    """Whether this harness runs from a source checkout (editable install, PYTHONPATH), not site-packages.
    Checked by the checkout's pyproject.toml too: some packages install a stray top-level ``tests/``."""
    return CHECKOUT_ROOT.is_dir() and (CHECKOUT_ROOT.parents[1] / "pyproject.toml").is_file()


def existing(root: Path) -> Path:
    """``root`` when it is a directory; a golden root that does not exist is bad input, not 'no golden'."""
    if not Path(root).is_dir():
        raise UsageError(f"golden directory {root} does not exist")
    return Path(root)


def writable(root: Path) -> Path:
    """``root`` unless it is the read-only copy shipped inside the installed package."""
    resolved = Path(root).resolve()
    if not in_checkout() and (resolved == PACKAGED_ROOT or PACKAGED_ROOT in resolved.parents):
        raise UsageError(f"refusing to write into the goldens shipped with the package ({PACKAGED_ROOT}); "
                         f"name a directory with --golden-dir or ${ENV_VAR}")
    return Path(root)


def directory_for(kind: str, root: Path) -> Path:
    """Where goldens of a record kind live under ``root``."""
    return root / CPU_SUBDIR if kind == "cpu-probe" else root


def labels_dir(root: Path) -> Path:
    return root / LABELS_SUBDIR


def estimate_dir(root: Path) -> Path:
    return root / ESTIMATE_SUBDIR


def golden_path_for(records: Sequence[Record], root: Path) -> Path:
    """The golden named by the records' own recipe × hardware × revision pins."""
    if not records:
        raise UsageError("no records to find a golden for")
    first = records[0]
    return directory_for(first.kind, root) / golden_filename_for(first)


def resolve_golden(records: Sequence[Record], golden: Path) -> Path:
    """``golden`` when it is a file; for a directory (a golden root or a kind's own directory), the
    golden named by the records' pins in it."""
    golden = Path(golden)
    if not golden.is_dir():
        return golden
    name = golden_filename_for(records[0])
    nested = directory_for(records[0].kind, golden) / name
    return nested if nested.is_file() or not (golden / name).is_file() else golden / name


def newest_like(target: Path) -> tuple[Path, Golden] | None:
    """The golden ``target`` replaces: ``target`` itself when it exists, else the most recently
    written golden of the same recipe × hardware (any revision pins) beside it."""
    if target.is_file():
        return target, load_golden(target)
    prefix = "__".join(target.name.split("__")[:2])
    candidates = []
    for path in sorted(target.parent.glob(f"{prefix}__*.json")):
        golden = load_golden(path)
        if recipe_slug(golden.recipe, golden.hardware) == prefix:
            candidates.append((golden.date, path.name, path, golden))
    if not candidates:
        return None
    _, _, path, golden = max(candidates, key=lambda item: (item[0], item[1]))
    return path, golden


if __name__ == "__main__":
    # ``python -m harness.record.golden_dir RECORDS``: the golden a sweep's records are judged by
    # (ci/nightly-gpu.sh); the root follows $RECOMPUTE_HARNESS_GOLDEN_DIR like every command.
    from harness.record.io import load_records

    print(golden_path_for(load_records([sys.argv[1]]), golden_root()))
