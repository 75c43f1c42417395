"""Where goldens live, what each file is named, which golden a set of records is judged by, and
reading and writing them (strict, atomic).

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

import hashlib
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.files import write_json_atomic
from harness.golden.format import Golden, identity_differences, validate_golden
from harness.record.io import load_records, read_json
from harness.record.model import Record

ENV_VAR = "RECOMPUTE_HARNESS_GOLDEN_DIR"
CHECKOUT_ROOT = Path(__file__).resolve().parents[2] / "tests" / "golden"
PACKAGED_ROOT = Path(__file__).resolve().parents[1] / "data" / "golden"
CPU_SUBDIR = "cpu"
LABELS_SUBDIR = "labels"
ESTIMATE_SUBDIR = "estimate"  # `estimate --write-golden` files (not run goldens: harness.estimate)
CAPACITY_SUBDIR = "capacity"  # `plan --write-golden` files (harness.plan)


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
        raise UsageError(
            f"refusing to write into the goldens shipped with the package ({PACKAGED_ROOT}); "
            f"name a directory with --golden-dir or ${ENV_VAR}"
        )
    return Path(root)


def directory_for(kind: str, root: Path) -> Path:
    """Where goldens of a record kind live under ``root``."""
    return root / CPU_SUBDIR if kind == "cpu-probe" else root


def root_of(golden_file: Path) -> Path:
    """The golden root a golden file lives in: its directory, or that directory's parent when it is
    the subdirectory of the file's kind (``cpu/`` for CPU-probe goldens)."""
    directory = Path(golden_file).parent
    kind = load_golden(golden_file).kind
    return directory.parent if directory_for(kind, directory.parent) == directory else directory


def labels_dir(root: Path) -> Path:
    return root / LABELS_SUBDIR


def estimate_dir(root: Path) -> Path:
    return root / ESTIMATE_SUBDIR


def pin_slug(pins: dict[str, Any]) -> str:
    """``mcore-<commit12>`` or ``mcore-<version>-<fingerprint>``, ``bridge-<commit12|version>``, ``stack-<digest>``."""
    mcore = pins["megatron_core"] or {}
    parts = [
        f"mcore-{mcore['commit'][:12]}"
        if mcore.get("commit")
        else f"mcore-{mcore.get('version')}-{mcore.get('fingerprint')}"
    ]
    bridge = pins["megatron_bridge"]
    if bridge:
        parts.append(
            f"bridge-{bridge['commit'][:12]}"
            if bridge.get("commit")
            else f"bridge-{bridge.get('version')}"
        )
    stack = [pins[key] for key in ("torch", "transformer_engine", "cuda")]
    if any(stack):  # torch / TE / CUDA are pins too: a new stack gets its own file
        parts.append("stack-" + hashlib.sha256(json.dumps(stack).encode()).hexdigest()[:8])
    return "__".join(parts)


def recipe_slug(recipe: str, hardware: dict[str, Any]) -> str:
    """The part of a golden's file name every revision of one recipe × hardware shares."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", recipe)
    return f"{slug}__{hardware['device']}x{hardware['gpu_count']}"


def file_name(*parts: str) -> str:
    """The one naming scheme of every golden kind: what it is of, what it ran on, then its pins,
    joined by ``__`` (a label manifest is of a fingerprint alone)."""
    return "__".join(parts) + ".json"


def golden_filename(recipe: str, hardware: dict[str, Any], pins: dict[str, Any]) -> str:
    return file_name(recipe_slug(recipe, hardware), pin_slug(pins))


def golden_filename_for(record: Record) -> str:
    return golden_filename(record.workload.recipe, record.hardware.profile(), record.pins())


def estimate_golden_path(
    recipe: str, attention_backend: str, megatron_core: dict[str, Any], root: Path | None = None
) -> Path:
    """``<golden root>/estimate/<recipe>__<attention>__mcore-<version>-<fingerprint>.json``: an
    estimate measures the recompute sources, so its pins are MCore's version and fingerprint only."""
    version, fingerprint = megatron_core.get("version"), megatron_core.get("fingerprint")
    return estimate_dir(golden_root(root)) / file_name(
        recipe, attention_backend, f"mcore-{version}-{fingerprint}"
    )


def capacity_golden_path(
    recipe: str, attention_backend: str, megatron_core: dict[str, Any], root: Path | None = None
) -> Path:
    """``<golden root>/capacity/<recipe>__<attention>__mcore-<version>-<fingerprint>.json``: a plan
    is of the estimate's measurements plus the model built at those pins, so the same pins."""
    version, fingerprint = megatron_core.get("version"), megatron_core.get("fingerprint")
    return (
        golden_root(root)
        / CAPACITY_SUBDIR
        / file_name(recipe, attention_backend, f"mcore-{version}-{fingerprint}")
    )


def label_manifest_path(fingerprint: str, root: Path | None = None) -> Path:
    """``<golden root>/labels/<fingerprint>.json``."""
    return labels_dir(golden_root(root)) / file_name(fingerprint)


def load_golden(path: Path) -> Golden:
    return Golden.from_json(read_json(Path(path)), str(path))


def write_golden(path: Path, golden: Golden) -> None:
    data = golden.to_json()
    write_json_atomic(Path(path), validate_golden(data, str(path)))


def golden_path_for(records: Sequence[Record], root: Path) -> Path:
    """The golden named by the records' own recipe × hardware × revision pins."""
    if not records:
        raise UsageError("no records to find a golden for")
    first = records[0]
    return directory_for(first.kind, root) / golden_filename_for(first)


def goldens_of(recipe: str, hardware: dict[str, Any], directory: Path) -> list[tuple[Path, Golden]]:
    """Every golden of one recipe × hardware in ``directory`` (any revision pins)."""
    return _goldens_named(recipe_slug(recipe, hardware), Path(directory))


def _goldens_named(prefix: str, directory: Path) -> list[tuple[Path, Golden]]:
    found = []
    for path in sorted(directory.glob(f"{prefix}__*.json")):
        golden = load_golden(path)
        if (
            recipe_slug(golden.recipe, golden.hardware) == prefix
        ):  # not a recipe whose name extends this one
            found.append((path, golden))
    return found


def resolve_golden(records: Sequence[Record], golden: Path) -> Path:
    """``golden`` when it is a file; for a directory (a golden root or a kind's own directory), the
    golden that judges the records there: the one their pins name, else the one golden of their
    recipe × hardware whose pins they match another way. A golden pinned by commit and by version +
    fingerprint serves the same recompute sources installed without a commit (a wheel) and as a git
    submodule (a commit), though only one of the two spellings names its file. A path that does not
    exist (no golden for these records) is returned as the file their pins name."""
    golden = Path(golden)
    if not golden.is_dir():
        return golden
    first = records[0]
    name = golden_filename_for(first)
    nested = directory_for(first.kind, golden) / name
    for candidate in (nested, golden / name):
        if candidate.is_file():
            return candidate
    directory = nested.parent if nested.parent.is_dir() else golden
    matching = [
        path
        for path, found in goldens_of(first.workload.recipe, first.hardware.profile(), directory)
        if not identity_differences(found, first)
    ]
    if len(matching) > 1:
        raise UsageError(
            f"{len(matching)} goldens in {directory} match these records' pins "
            f"({', '.join(path.name for path in matching)}); name one with --golden"
        )
    return matching[0] if matching else nested


def near_misses(records: Sequence[Record], missing: Path) -> str:
    """Why no golden in ``missing``'s directory judges ``records``: each golden of their recipe ×
    hardware there, with the pins that differ (empty when there is none)."""
    first = records[0]
    found = (
        goldens_of(first.workload.recipe, first.hardware.profile(), missing.parent)
        if missing.parent.is_dir()
        else []
    )
    return "; ".join(
        f"{path.name} differs in {', '.join(identity_differences(golden, first))}"
        for path, golden in found
    )


def newest_like(target: Path, version: str | None = None) -> tuple[Path, Golden] | None:
    """The golden ``target`` replaces: ``target`` itself when it exists, else the most recently
    written golden of the same recipe × hardware (any revision pins) beside it; with goldens for
    several revisions on disk, one of Megatron Core ``version`` (the nearest revision: an edited
    0.19.2 tree is judged against 0.19.2, a pull request on main against the head) comes first."""
    if target.is_file():
        return target, load_golden(target)
    candidates = _goldens_named("__".join(target.name.split("__")[:2]), target.parent)
    if not candidates:
        return None

    def nearness(found: tuple[Path, Golden]) -> tuple[bool, str, str]:
        pinned = (found[1].pins.get("megatron_core") or {}).get("version")
        return version is not None and pinned == version, found[1].date, found[0].name

    return max(candidates, key=nearness)


if __name__ == "__main__":
    # ``python -m harness.golden.store RECORDS``: the golden a sweep's records are judged by
    # (ci/nightly-gpu.sh); the root follows $RECOMPUTE_HARNESS_GOLDEN_DIR like every command.
    print(resolve_golden(load_records([sys.argv[1]]), golden_root()))
