"""Label manifests: the recompute labels a Megatron Core source fingerprint accepts, pinned as a golden.

One file per fingerprint under the golden root's ``labels/`` (``harness.golden.store``), written
only from the installed validator (``harness.config.labels.accepted_labels``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config.labels import accepted_labels
from harness.config.revisions import collect_revisions, require_identity
from harness.errors import UsageError
from harness.files import require_writable_dir, write_json_atomic
from harness.golden.store import existing, golden_root, label_manifest_path, labels_dir, writable

MANIFEST_SCHEMA = "recompute-harness/label-manifest"
REFRESH_COMMAND = "./venv-run recompute-harness labels --write-manifest"


def write_manifest(root: Path | None = None) -> tuple[Path, bool]:
    """Write the manifest for the imported MCore: (path, written). Atomic; never half-written.

    Refused (``UsageError``) when the imported MCore has no identity or the labels directory is not
    writable. A manifest whose labels and identity are unchanged is left alone, byte for byte (its
    ``created`` stays), so a refresh on an unchanged revision writes nothing.
    """
    require_identity()
    require_writable_dir(labels_dir(golden_root(root)))
    mcore = collect_revisions()["megatron_core"]
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "schema_version": 1,
        "fingerprint": mcore["fingerprint"],
        "megatron_core": {"version": mcore["version"], "commit": mcore["commit"]},
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "written_by": REFRESH_COMMAND,
        "labels": sorted(accepted_labels()),
    }
    path = label_manifest_path(mcore["fingerprint"], writable(golden_root(root)))
    if path.is_file():
        try:
            previous = _load(path)
        except UsageError:
            previous = {}  # an unreadable manifest is replaced
        if {**previous, "created": None} == {**manifest, "created": None}:
            return path, False
    write_json_atomic(path, manifest)
    return path, True


def _load(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: unreadable label manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise UsageError(f"{path} is not a label manifest (schema {MANIFEST_SCHEMA!r} expected)")
    return manifest


def manifest_problem(root: Path | None = None) -> str | None:
    """Why the discovered labels do not match the pinned manifest; None when they do.

    Without a manifest for the installed fingerprint, the newest manifest on disk is the reference,
    so an MCore bump that adds or removes labels reads as a label diff, not just a missing file.
    """
    fingerprint = collect_revisions()["megatron_core"]["fingerprint"]
    path = label_manifest_path(fingerprint, existing(golden_root(root)))
    directory = path.parent
    current = set(accepted_labels())
    if path.is_file():
        reference = _load(path)
        headline = f"recompute labels differ from the manifest {path.name}"
    else:
        others = sorted(
            ((p, _load(p)) for p in directory.glob("*.json")), key=lambda item: item[1]["created"]
        )
        if not others:
            return f"no label manifest in {directory}; write one with: {REFRESH_COMMAND}"
        newest, reference = others[-1]
        headline = (
            f"no label manifest for Megatron Core fingerprint {fingerprint}; newest is {newest.name} "
            f"(megatron-core {reference['megatron_core']['version']})"
        )
    pinned = set(reference["labels"])
    if path.is_file() and pinned == current:
        return None
    added, removed = sorted(current - pinned), sorted(pinned - current)
    changes = [f"added: {', '.join(added)}"] if added else []
    changes += [f"removed: {', '.join(removed)}"] if removed else []
    diff = "; ".join(changes) or "labels unchanged"
    return f"{headline}: {diff}. Review the change, then refresh with: {REFRESH_COMMAND}"
