"""The recompute labels the installed Megatron Core validator accepts, discovered from the validator.

Nothing here lists labels. Candidates are every quoted identifier in ``transformer_config.py`` plus
whatever MCore's unknown-label message names; each candidate is then put to the real validator as
``selective + [candidate]``. A candidate is unknown exactly when MCore answers with the same message
it gives a made-up sentinel label (with the name substituted), so the verdict does not depend on the
wording of that message, on how the allowed set is stored, or on other rules a label triggers
(``moe_act`` without grouped GEMM is rejected, but not as unknown).

A label manifest per source fingerprint (tests/golden/labels/<fingerprint>.json) pins the set; the
unit tests compare the discovered set with it.
"""

from __future__ import annotations

import json
import re
import warnings
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.config.revisions import collect_revisions, megatron_core_root
from harness.errors import UsageError
from harness.files import write_json_atomic

MANIFEST_SCHEMA = "recompute-harness/label-manifest"
MANIFEST_DIR = Path(__file__).resolve().parents[2] / "tests" / "golden" / "labels"
REFRESH_COMMAND = "./venv-run recompute-harness labels --write-manifest"

_SENTINEL = "harness_sentinel_not_a_label"
_QUOTED_IDENTIFIER = re.compile(r"""["']([A-Za-z_][A-Za-z0-9_]*)["']""")


def _rejection(modules: list[str]) -> str | None:
    """MCore's message for ``selective + modules`` on the base model, or None when accepted."""
    from harness.config.validate import BASE_MODEL, config_classes

    transformer_config = config_classes()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            transformer_config(**BASE_MODEL, recompute_granularity="selective", recompute_modules=modules)
        except (AssertionError, ValueError) as exc:
            return str(exc)
    return None


def _candidates(unknown_message: str) -> set[str]:
    root = megatron_core_root()
    source = (root / "transformer" / "transformer_config.py").read_text() if root else ""
    return set(_QUOTED_IDENTIFIER.findall(source)) | set(_QUOTED_IDENTIFIER.findall(unknown_message))


@lru_cache(maxsize=1)
def accepted_labels() -> frozenset[str]:
    """Every recompute label the installed validator accepts under selective granularity."""
    unknown_message = _rejection([_SENTINEL])
    if unknown_message is None or _SENTINEL not in unknown_message:
        raise UsageError(
            "the installed Megatron Core accepted a made-up recompute label (or did not name it when "
            f"rejecting it), so known labels cannot be told from unknown ones; MCore said: {unknown_message!r}"
        )
    return frozenset(
        label
        for label in _candidates(unknown_message) - {_SENTINEL}
        if _rejection([label]) != unknown_message.replace(_SENTINEL, label)
    )


# --- the manifest ------------------------------------------------------------------------------------


def manifest_path(fingerprint: str, directory: Path = MANIFEST_DIR) -> Path:
    return directory / f"{fingerprint}.json"


def write_manifest(directory: Path = MANIFEST_DIR) -> Path:
    """Write the manifest for the installed MCore (temp file + rename: never half-written)."""
    revisions = collect_revisions()
    mcore = revisions["megatron_core"]
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "schema_version": 1,
        "fingerprint": mcore["fingerprint"],
        "megatron_core": {"version": mcore["version"], "commit": mcore["commit"]},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "written_by": REFRESH_COMMAND,
        "labels": sorted(accepted_labels()),
    }
    path = manifest_path(mcore["fingerprint"], directory)
    write_json_atomic(path, manifest)
    return path


def _load(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: unreadable label manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise UsageError(f"{path} is not a label manifest (schema {MANIFEST_SCHEMA!r} expected)")
    return manifest


def manifest_problem(directory: Path = MANIFEST_DIR) -> str | None:
    """Why the discovered labels do not match the pinned manifest; None when they do.

    Without a manifest for the installed fingerprint, the newest manifest on disk is the reference,
    so an MCore bump that adds or removes labels reads as a label diff, not just a missing file.
    """
    fingerprint = collect_revisions()["megatron_core"]["fingerprint"]
    path = manifest_path(fingerprint, directory)
    current = set(accepted_labels())
    if path.is_file():
        reference = _load(path)
        headline = f"recompute labels differ from the manifest {path.name}"
    else:
        others = sorted(((p, _load(p)) for p in directory.glob("*.json")), key=lambda item: item[1]["created"])
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
