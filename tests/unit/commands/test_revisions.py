"""The development head is judged against its committed goldens, for real: a Megatron-LM work tree at
``overlays.HEAD_COMMIT`` (skipped, with the reason, where no Megatron-LM repository is at hand). A whole
probe, outside the CPU tier's budget: .ci/run's ``unreleased`` step (``pytest -m unreleased -n 2``,
with the edited trees of test_unreleased_trees.py). The released revisions are judged by real bumps to
them (commands/test_bump.py, the ``revisions`` step): their goldens must come out rewritten by nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from overlays import harness_on, megatron_lm_tree

# A whole probe: first, so the step's two workers each start on one (--dist loadscope).
pytestmark = [pytest.mark.slow, pytest.mark.unreleased]


def head_tree() -> Path:
    try:
        return megatron_lm_tree()
    except LookupError as exc:
        pytest.skip(f"no development head tree: {exc}")


def test_the_head_matches_its_committed_goldens():
    tree = head_tree()
    labels = harness_on(tree, "labels", "--check")
    assert labels.returncode == 0 and labels.stdout.startswith("recompute labels match"), labels
    # One process: the step's other worker runs a whole probe too (two probes of two workers each on
    # two cores took 122 s side by side, of one process each 96 s).
    probe = harness_on(tree, "probe", "--all", "--check-golden", "--jobs", "1", "--details")
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-2000:]
    # fp32 and bf16 of the style models the head can build, its hyper-connections and
    # GatedDeltaProduct among them; its MTP layer cannot be built without Transformer Engine.
    assert probe.stdout.count(": matches cpu-probe-") == 2 * 8
    assert "mhc-tiny: matches cpu-probe-mhc-tiny__" in probe.stdout
    assert "gdp-tiny: matches cpu-probe-gdp-tiny__" in probe.stdout
    assert "\nnot probed here: mtp-tiny: requires-TE: " in probe.stdout
