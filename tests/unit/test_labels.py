"""Label discovery from the installed validator, and the per-fingerprint label manifest."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.config.labels import REFRESH_COMMAND, accepted_labels, manifest_problem, write_manifest
from harness.config.validate import validate
from harness.errors import UsageError


def test_every_discovered_label_passes_the_unknown_label_rule():
    labels = accepted_labels()
    assert labels, "label discovery found nothing"
    for label in labels:
        assert validate({"recompute_granularity": "selective", "recompute_modules": [label]}).rule != "labels.unknown"


def test_discovery_agrees_with_the_set_mcore_names_when_rejecting():
    verdict = validate({"recompute_granularity": "selective", "recompute_modules": ["not_a_label"]})
    assert verdict.rule == "labels.unknown"
    named = verdict.message.split("Allowed modules are:")[1]
    assert {label for label in accepted_labels() if f"'{label}'" in named} == accepted_labels()


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
    path.rename(tmp_path / "0000000000000000.json")
    problem = manifest_problem(tmp_path)
    assert "no label manifest for Megatron Core fingerprint" in problem and "labels unchanged" in problem


def test_corrupt_manifest_is_a_usage_error(tmp_path):
    path = write_manifest(tmp_path)
    path.write_bytes(b"{not json")
    with pytest.raises(UsageError, match="unreadable label manifest"):
        manifest_problem(tmp_path)


def test_labels_command(capsys):
    assert main(["labels"]) == 0
    assert capsys.readouterr().out.split() == sorted(accepted_labels())
    assert main(["labels", "--check"]) == 0
