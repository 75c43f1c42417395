"""Every supported Megatron Core revision is judged against its committed goldens, for real: the
released 0.18.2 and 0.19.0 as wheel overlays, the development head as a Megatron-LM work tree at
``overlays.HEAD_COMMIT`` (skipped, with the reason, where no Megatron-LM repository is at hand);
a comment-only edit of a recompute file is "same behaviour" in labels --check, probe --check-golden
and diff. Its own CI step (``pytest -m revisions -n 2``, .ci/run), outside the CPU tier's budget."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from overlays import WHOLE_PROBE_TIMEOUT_S, megatron_lm_tree, overlay, pull_request_trees

from harness.config.revisions import megatron_core_root

pytestmark = pytest.mark.revisions

REPO = Path(__file__).resolve().parents[3]


def harness(tree: Path | None, *argv: str) -> subprocess.CompletedProcess:
    path = [str(tree)] if tree is not None else []
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=WHOLE_PROBE_TIMEOUT_S,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])},
    )


def head_tree() -> Path:
    try:
        return megatron_lm_tree()
    except LookupError as exc:
        pytest.skip(f"no development head tree: {exc}")


# 0.18.2 is judged by commands/test_bump.py's real bump to it: its goldens come out rewritten by nothing.
@pytest.mark.parametrize("revision", ["0.19.0", "head"])
def test_each_revision_matches_its_committed_goldens(revision):
    tree = head_tree() if revision == "head" else overlay(revision)
    labels = harness(tree, "labels", "--check")
    assert labels.returncode == 0 and labels.stdout.startswith("recompute labels match"), labels
    probe = harness(tree, "probe", "--all", "--check-golden")
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


def test_a_comment_only_edit_is_same_behaviour_everywhere(tmp_path):
    installed = megatron_core_root().parent
    copy = tmp_path / "edited"
    shutil.copytree(installed, copy / "megatron", ignore=shutil.ignore_patterns("__pycache__"))
    random_py = copy / "megatron" / "core" / "tensor_parallel" / "random.py"
    random_py.write_text(random_py.read_text() + "\n# a comment: no behaviour changes here\n")

    labels = harness(copy, "labels", "--check")
    assert labels.returncode == 0 and labels.stdout.startswith("same behaviour: "), labels
    probe = harness(copy, "probe", "--model", "dense-tiny", "--check-golden")
    assert probe.returncode == 0, probe.stdout[-3000:]
    assert "dense-tiny: same behaviour: no golden " in probe.stdout
    diff = harness(None, "diff", "--model", "dense-tiny", str(installed.parent), str(copy))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "\nprobed: dense-tiny (fp32, unfused core attention)\n" in diff.stdout  # only that model
    assert diff.stdout.rstrip().endswith(
        "verdict: same behaviour (new fingerprint, no value changed)"
    )


def test_skip_final_recompute_is_measured_where_a_tree_declares_it():
    # Megatron-LM #4921 (not merged) adds TransformerConfig.skip_final_recompute: the probe plans
    # its rows from the tree's own config and measures what the field does to each unit.
    try:
        _, pr_head = pull_request_trees(4921)
    except LookupError as exc:
        pytest.skip(f"no Megatron-LM pull request #4921: {exc}")
    probe = harness(pr_head, "probe", "--model", "dense-deep", "--precision", "fp32", "--json")
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-2000:]
    rows = {row["label"]: row for row in json.loads(probe.stdout)[0]["rows"]}
    layers = 4  # dense-deep
    skip_rows = [label for label in rows if label.endswith("-skip-final")]
    assert len(skip_rows) == 2 * (layers + 1)  # every method x recompute_num_layers pair again
    retained = {label: row["retained_bytes"] for label, row in rows.items()}
    # block: the last of the first n checkpointed layers runs plainly, as under block with n - 1.
    for n in range(2, layers + 1):
        assert retained[f"full-block-{n}-skip-final"] == retained[f"full-block-{n - 1}"]
    # uniform 1: every layer but the last checkpointed alone, which is block with L - 1.
    assert retained["full-uniform-1-skip-final"] == retained[f"full-block-{layers - 1}"]
    # uniform L: the one unit is the final one, so nothing is recomputed.
    assert rows[f"full-uniform-{layers}-skip-final"]["status"] == "inactive"
    assert rows["full-block-1-skip-final"]["status"] == "inactive"
