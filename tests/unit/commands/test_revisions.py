"""Every supported Megatron Core revision is judged against its committed goldens, for real: the
released 0.19.0 as a wheel overlay (0.18.2: test_bump.py's real bump to it), the development head as
a Megatron-LM work tree at ``overlays.HEAD_COMMIT`` (skipped, with the reason, where no Megatron-LM
repository is at hand). A whole probe each, outside the CPU tier's budget: 0.19.0 in .ci/run's
``revisions`` step (``pytest -m revisions -n 2``), the head in its ``unreleased`` step (``pytest -m
unreleased -n 2``, with the edited trees of test_unreleased_trees.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from overlays import harness_on, megatron_lm_tree, overlay

# A whole probe each: first, so the step's two workers each start on one (--dist loadscope).
pytestmark = pytest.mark.slow


def head_tree() -> Path:
    try:
        return megatron_lm_tree()
    except LookupError as exc:
        pytest.skip(f"no development head tree: {exc}")


# 0.18.2 is judged by commands/test_bump.py's real bump to it: its goldens come out rewritten by nothing.
@pytest.mark.parametrize(
    "revision",
    [
        pytest.param("0.19.0", marks=pytest.mark.revisions),
        pytest.param("head", marks=pytest.mark.unreleased),
    ],
)
def test_each_revision_matches_its_committed_goldens(revision):
    tree = head_tree() if revision == "head" else overlay(revision)
    if revision == "head":  # 0.19.0's manifest: test_bump.py's bump to it says its labels match
        labels = harness_on(tree, "labels", "--check")
        assert labels.returncode == 0 and labels.stdout.startswith("recompute labels match"), labels
    # One process: the step's other worker runs a whole probe too (two probes of two workers each on
    # two cores took 122 s side by side, of one process each 96 s).
    probe = harness_on(tree, "probe", "--all", "--check-golden", "--jobs", "1")
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-2000:]
    # fp32 and bf16 of the style models each tree can build: mhc-tiny and gdp-tiny need the head's
    # hyper-connections and GatedDeltaProduct; the head's MTP layer cannot be built without
    # Transformer Engine.
    assert probe.stdout.count(": matches cpu-probe-") == 2 * (8 if revision == "head" else 7)
    if revision != "head":
        assert (
            "\nnot probed here: mhc-tiny: this Megatron Core has no HyperConnection" in probe.stdout
        )
        assert "\nnot probed here: gdp-tiny: this Megatron Core has no GatedDeltaProduct" in (
            probe.stdout
        )
    else:
        assert "mhc-tiny: matches cpu-probe-mhc-tiny__" in probe.stdout
        assert "gdp-tiny: matches cpu-probe-gdp-tiny__" in probe.stdout
        assert "\nnot probed here: mtp-tiny: requires-TE: " in probe.stdout
