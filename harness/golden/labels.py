"""Label manifests: the recompute labels a Megatron Core source fingerprint accepts, pinned as a golden.

One file per fingerprint under the golden root's ``labels/`` (``harness.golden.store``), written
only from the installed validator (``harness.config.labels.accepted_labels``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config.labels import accepted_labels
from harness.config.revisions import collect_revisions, require_identity
from harness.errors import UsageError
from harness.files import require_writable_dir, write_json_atomic
from harness.golden.store import existing, golden_root, label_manifest_path, labels_dir, writable

MANIFEST_SCHEMA = "recompute-harness/label-manifest"
MANIFEST_SCHEMA_VERSION = 1
REFRESH_COMMAND = "./venv-run recompute-harness labels --write-manifest"


@dataclass(frozen=True)
class LabelManifest:
    """The recompute labels one Megatron Core source fingerprint accepts, and where they came from."""

    fingerprint: str
    megatron_core: dict[str, str | None]  # version, commit (null for a wheel)
    created: str  # when first written; a rewrite with nothing else changed keeps it
    written_by: str
    labels: tuple[str, ...]  # sorted

    @classmethod
    def from_json(cls, data: Any, source: str) -> LabelManifest:
        """The manifest in ``data``; ``UsageError`` (one line naming ``source``) when it is not one."""
        if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
            raise UsageError(
                f"{source} is not a label manifest (schema {MANIFEST_SCHEMA!r} expected)"
            )
        version = data.get("schema_version")
        if isinstance(version, bool) or version != MANIFEST_SCHEMA_VERSION:
            raise UsageError(
                f"{source}: unknown label manifest schema version {version!r}; this harness "
                f"reads {MANIFEST_SCHEMA_VERSION}"
            )
        expected = {"schema", "schema_version", *(f.name for f in fields(cls))}
        if set(data) != expected:
            raise UsageError(f"{source}: expected the keys {', '.join(sorted(expected))}")
        mcore, labels = data["megatron_core"], data["labels"]
        if (
            not all(isinstance(data[key], str) for key in ("fingerprint", "created", "written_by"))
            or not isinstance(mcore, dict)
            or set(mcore) != {"version", "commit"}
            or any(v is not None and not isinstance(v, str) for v in mcore.values())
            or not isinstance(labels, list)
            or not all(isinstance(label, str) for label in labels)
        ):
            raise UsageError(
                f"{source}: fingerprint, created and written_by are strings, megatron_core "
                "{version, commit} strings or null, labels a list of strings"
            )
        return cls(
            data["fingerprint"], dict(mcore), data["created"], data["written_by"], tuple(labels)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "fingerprint": self.fingerprint,
            "megatron_core": dict(self.megatron_core),
            "created": self.created,
            "written_by": self.written_by,
            "labels": list(self.labels),
        }


def write_manifest(root: Path | None = None) -> tuple[Path, bool]:
    """Write the manifest for the imported MCore: (path, written). Atomic; never half-written.

    Refused (``UsageError``) when the imported MCore has no identity or the labels directory is not
    writable. A manifest whose labels and identity are unchanged is left alone, byte for byte (its
    ``created`` stays), so a refresh on an unchanged revision writes nothing.
    """
    require_identity()
    require_writable_dir(labels_dir(golden_root(root)))
    mcore = collect_revisions()["megatron_core"]
    manifest = LabelManifest(
        fingerprint=mcore["fingerprint"],
        megatron_core={"version": mcore["version"], "commit": mcore["commit"]},
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        written_by=REFRESH_COMMAND,
        labels=tuple(sorted(accepted_labels())),
    )
    path = label_manifest_path(mcore["fingerprint"], writable(golden_root(root)))
    if path.is_file():
        try:
            previous = load_manifest(path)
        except UsageError:
            previous = None  # an unreadable manifest is replaced
        if previous is not None and replace(previous, created=manifest.created) == manifest:
            return path, False
    write_json_atomic(path, manifest.to_json())
    return path, True


def load_manifest(path: Path) -> LabelManifest:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: unreadable label manifest ({exc})") from None
    return LabelManifest.from_json(data, str(path))


def manifest_problem(root: Path | None = None) -> str | None:
    """Why the discovered labels do not match the pinned manifest; None when they do (or when a new
    revision's labels equal the newest manifest's: same behaviour, ``manifest_verdict``)."""
    line, changed = manifest_verdict(root)
    return line if changed else None


def manifest_verdict(root: Path | None = None) -> tuple[str, bool]:
    """(one line, whether the labels changed) against the pinned manifest.

    Without a manifest for the installed fingerprint, the newest manifest on disk is the reference,
    so an MCore bump that adds or removes labels reads as a label diff, not just a missing file, and
    one that keeps them reads as "same behaviour" (not changed).
    """
    fingerprint = collect_revisions()["megatron_core"]["fingerprint"]
    path = label_manifest_path(fingerprint, existing(golden_root(root)))
    directory = path.parent
    current = set(accepted_labels())
    if path.is_file():
        reference = load_manifest(path)
        headline = f"recompute labels differ from the manifest {path.name}"
    else:
        version = collect_revisions()["megatron_core"]["version"]
        # The nearest revision first (same Megatron Core version), then the newest manifest.
        others = sorted(
            ((p, load_manifest(p)) for p in directory.glob("*.json")),
            key=lambda item: (item[1].megatron_core["version"] == version, item[1].created),
        )
        if not others:
            return f"no label manifest in {directory}; write one with: {REFRESH_COMMAND}", True
        newest, reference = others[-1]
        headline = (
            f"no label manifest for Megatron Core fingerprint {fingerprint}; newest is {newest.name} "
            f"(megatron-core {reference.megatron_core['version']})"
        )
    pinned = set(reference.labels)
    if pinned == current:
        if path.is_file():
            return "recompute labels match the manifest", False
        return f"same behaviour: {headline}: labels unchanged", False
    added, removed = sorted(current - pinned), sorted(pinned - current)
    changes = [f"added: {', '.join(added)}"] if added else []
    changes += [f"removed: {', '.join(removed)}"] if removed else []
    diff = "; ".join(changes)
    return f"{headline}: {diff}. Review the change, then refresh with: {REFRESH_COMMAND}", True
