"""The per-fingerprint label manifest: pinned under the golden root's labels/, diffed after a bump."""

from __future__ import annotations

import json

import pytest

from harness.errors import UsageError
from harness.files import write_json_atomic
from harness.golden.labels import REFRESH_COMMAND, load_manifest, manifest_problem, write_manifest
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


def test_new_fingerprint_is_compared_with_the_newest_manifest(tmp_path):
    path, _ = write_manifest(tmp_path)
    path.rename(path.parent / "0000000000000000.json")
    problem = manifest_problem(tmp_path)
    assert (
        "no label manifest for Megatron Core fingerprint" in problem
        and "labels unchanged" in problem
    )


def test_corrupt_manifest_is_a_usage_error(tmp_path):
    path, _ = write_manifest(tmp_path)
    path.write_bytes(b"{not json")
    with pytest.raises(UsageError, match="unreadable label manifest"):
        manifest_problem(tmp_path)


def test_manifest_lives_under_the_roots_labels_directory(tmp_path):
    assert write_manifest(tmp_path)[0].parent == tmp_path / "labels"


def test_the_committed_manifest_loads_as_a_typed_manifest_and_writes_back_byte_for_byte(tmp_path):
    (committed,) = (CHECKOUT_ROOT / "labels").glob("*.json")
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
    (committed,) = (CHECKOUT_ROOT / "labels").glob("*.json")
    data = json.loads(committed.read_text())
    edit(data)
    path = tmp_path / committed.name
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=refusal) as refused:
        load_manifest(path)
    assert "\n" not in str(refused.value)
