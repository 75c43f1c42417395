"""The per-fingerprint label manifest: pinned under the golden root's labels/, diffed after a bump."""

from __future__ import annotations

import json

import pytest

from harness.errors import UsageError
from harness.record.label_manifest import REFRESH_COMMAND, manifest_problem, write_manifest


def test_labels_match_the_manifest_pinned_for_this_megatron_core():
    problem = manifest_problem()
    assert problem is None, problem


def test_label_change_reads_as_a_diff_naming_the_refresh_command(tmp_path):
    path = write_manifest(tmp_path)
    manifest = json.loads(path.read_text())
    dropped = manifest["labels"].pop()
    manifest["labels"].append("mhc")  # as a development head would add it
    path.write_text(json.dumps(manifest))
    problem = manifest_problem(tmp_path)
    assert f"added: {dropped}" in problem and "removed: mhc" in problem and REFRESH_COMMAND in problem


def test_new_fingerprint_is_compared_with_the_newest_manifest(tmp_path):
    path = write_manifest(tmp_path)
    path.rename(path.parent / "0000000000000000.json")
    problem = manifest_problem(tmp_path)
    assert "no label manifest for Megatron Core fingerprint" in problem and "labels unchanged" in problem


def test_corrupt_manifest_is_a_usage_error(tmp_path):
    path = write_manifest(tmp_path)
    path.write_bytes(b"{not json")
    with pytest.raises(UsageError, match="unreadable label manifest"):
        manifest_problem(tmp_path)


def test_manifest_lives_under_the_roots_labels_directory(tmp_path):
    assert write_manifest(tmp_path).parent == tmp_path / "labels"
