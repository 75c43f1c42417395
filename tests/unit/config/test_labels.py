"""Label discovery from the installed validator."""

from __future__ import annotations

from harness.cli import main
from harness.config.labels import accepted_labels
from harness.config.validate import validate
from harness.golden.labels import manifest_problem


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
    assert capsys.readouterr().out.split() == sorted(accepted_labels())
    # Exit 1 exactly when the manifest differs (named once, by the manifest test).
    assert main(["labels", "--check"]) == (0 if manifest_problem() is None else 1)
