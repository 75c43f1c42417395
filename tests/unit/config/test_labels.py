"""Label discovery from the installed validator."""

from __future__ import annotations

import json

from harness.cli import main
from harness.config.labels import accepted_labels
from harness.config.validate import validate


def test_every_discovered_label_passes_the_unknown_label_rule():
    labels = accepted_labels()
    assert labels, "label discovery found nothing"
    for label in labels:
        assert (
            validate({"recompute_granularity": "selective", "recompute_modules": [label]}).rule
            != "labels.unknown"
        )


def test_discovery_agrees_with_the_set_mcore_names_when_rejecting():
    verdict = validate({"recompute_granularity": "selective", "recompute_modules": ["not_a_label"]})
    assert verdict.rule == "labels.unknown"
    named = verdict.message.split("Allowed modules are:")[1]
    assert {label for label in accepted_labels() if f"'{label}'" in named} == accepted_labels()


def test_labels_command(capsys):
    assert main(["labels"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == sorted(printed)
    # Labels every Megatron Core since 0.14 accepts (its recompute_modules docstring); the full list
    # of a revision is its manifest, checked below.
    assert {"core_attn", "layernorm", "mlp", "moe", "moe_act"} <= set(printed)


def test_labels_check_passes_its_own_manifest_and_names_what_a_changed_one_lacks(capsys, tmp_path):
    root = tmp_path / "golden"
    assert main(["labels", "--write-manifest", "--golden-dir", str(root)]) == 0
    (written,) = (root / "labels").glob("*.json")
    capsys.readouterr()
    assert main(["labels", "--check", "--golden-dir", str(root)]) == 0
    assert capsys.readouterr().out == "recompute labels match the manifest\n"
    # The same manifest as a revision without `mlp` and with a label this one lacks would have written.
    manifest = json.loads(written.read_text())
    manifest["labels"] = [label for label in manifest["labels"] if label != "mlp"] + ["gone_label"]
    written.write_text(json.dumps(manifest))
    assert main(["labels", "--check", "--golden-dir", str(root)]) == 1
    assert "added: mlp; removed: gone_label." in capsys.readouterr().out
