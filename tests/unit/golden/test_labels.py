"""The per-fingerprint label manifest: pinned under the golden root's labels/, diffed after a bump."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.files import write_json_atomic
from harness.golden.labels import (
    REFRESH_COMMAND,
    load_manifest,
    manifest_problem,
    manifest_verdict,
    write_manifest,
)
from harness.golden.store import CHECKOUT_ROOT


def test_labels_match_the_manifest_pinned_for_this_megatron_core():
    problem = manifest_problem()
    assert problem is None, problem


def test_label_change_reads_as_a_diff_naming_the_refresh_command(tmp_path):
    path, written = write_manifest(tmp_path)
    assert written
    manifest = json.loads(path.read_text())
    dropped = manifest["labels"].pop()
    manifest["labels"].append(
        "harness_retired_label"
    )  # a label the pinned revision had and this one lacks
    path.write_text(json.dumps(manifest))
    problem = manifest_problem(tmp_path)
    assert (
        f"added: {dropped}" in problem
        and "removed: harness_retired_label" in problem
        and REFRESH_COMMAND in problem
    )


def test_rewriting_an_unchanged_manifest_writes_nothing(tmp_path):
    path, _ = write_manifest(tmp_path)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    assert write_manifest(tmp_path) == (path, False)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_an_unwritable_manifest_directory_is_refused(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(UsageError, match="not a writable directory"):
        write_manifest(blocked / "labels")


def test_new_fingerprint_with_the_same_labels_is_same_behaviour(tmp_path):
    path, _ = write_manifest(tmp_path)
    path.rename(path.parent / "0000000000000000.json")
    line, changed = manifest_verdict(tmp_path)
    assert not changed and manifest_problem(tmp_path) is None
    assert line.startswith("same behaviour: no label manifest for Megatron Core fingerprint")
    version = collect_revisions()["megatron_core"]["version"]
    assert line.endswith(
        f"newest is 0000000000000000.json (megatron-core {version}): labels unchanged"
    )
    assert main(["labels", "--check", "--golden-dir", str(tmp_path)]) == 0


def test_new_fingerprint_with_other_labels_is_a_change(tmp_path):
    path, _ = write_manifest(tmp_path)
    manifest = json.loads(path.read_text())
    manifest["labels"].append("harness_retired_label")
    path.unlink()
    (path.parent / "0000000000000000.json").write_text(json.dumps(manifest))
    line, changed = manifest_verdict(tmp_path)
    assert changed and "removed: harness_retired_label" in line
    assert main(["labels", "--check", "--golden-dir", str(tmp_path)]) == 1


def test_corrupt_manifest_is_a_usage_error(tmp_path):
    path, _ = write_manifest(tmp_path)
    path.write_bytes(b"{not json")
    with pytest.raises(UsageError, match="unreadable label manifest"):
        manifest_problem(tmp_path)


def test_manifest_lives_under_the_roots_labels_directory(tmp_path):
    assert write_manifest(tmp_path)[0].parent == tmp_path / "labels"


def test_the_committed_manifests_load_as_typed_manifests_and_write_back_byte_for_byte(tmp_path):
    # One per supported revision (0.18.2, 0.19.0, 0.19.2, the development head).
    for committed in sorted((CHECKOUT_ROOT / "labels").glob("*.json")):
        manifest = load_manifest(committed)
        assert manifest.fingerprint == committed.stem and "core_attn" in manifest.labels
        copy = tmp_path / committed.name
        write_json_atomic(copy, manifest.to_json())
        assert copy.read_bytes() == committed.read_bytes()


@pytest.mark.parametrize(
    ("edit", "refusal"),
    [
        (lambda m: m.pop("written_by"), r"expected the keys created, fingerprint, labels, "),
        (lambda m: m.update(labels="core_attn"), r"labels a list of strings$"),
        (lambda m: m.update(schema_version=2), r"unknown label manifest schema version 2; "),
    ],
)
def test_a_manifest_of_another_shape_is_refused_in_one_line(tmp_path, edit, refusal):
    committed = (
        CHECKOUT_ROOT / "labels" / f"{collect_revisions()['megatron_core']['fingerprint']}.json"
    )
    data = json.loads(committed.read_text())
    edit(data)
    path = tmp_path / committed.name
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=refusal) as refused:
        load_manifest(path)
    assert "\n" not in str(refused.value)
