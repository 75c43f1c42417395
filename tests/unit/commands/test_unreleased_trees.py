"""Megatron Core trees that are no release, judged for real: a comment-only edit of a recompute file
is "same behaviour" in labels --check, probe --check-golden and diff; Megatron-LM #4921's head (a pull
request, not merged) has its ``skip_final_recompute`` measured. Outside the CPU tier's budget: .ci/run's
``unreleased`` step (``pytest -m unreleased -n 2``), with the development head's goldens
(test_revisions.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from overlays import edited_tree, harness_on, pull_request_trees

from harness.config.revisions import megatron_core_root

pytestmark = [pytest.mark.slow, pytest.mark.unreleased]


def test_a_comment_only_edit_is_same_behaviour_everywhere(tmp_path):
    installed = megatron_core_root().parent
    copy = tmp_path / "edited"
    shutil.copytree(installed, copy / "megatron", ignore=shutil.ignore_patterns("__pycache__"))
    random_py = copy / "megatron" / "core" / "tensor_parallel" / "random.py"
    random_py.write_text(random_py.read_text() + "\n# a comment: no behaviour changes here\n")

    labels = harness_on(copy, "labels", "--check")
    assert labels.returncode == 0 and labels.stdout.startswith("same behaviour: "), labels
    # Both passes in one process: the step's other worker probes too.
    probe = harness_on(
        copy, "probe", "--model", "dense-tiny", "--check-golden", "--jobs", "1", "--details"
    )
    assert probe.returncode == 0, probe.stdout[-3000:]
    assert "dense-tiny: same behaviour: no golden " in probe.stdout
    diff = harness_on(None, "diff", "--model", "dense-tiny", str(installed.parent), str(copy))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "\nprobed: dense-tiny (fp32, unfused core attention)\n" in diff.stdout  # only that model
    assert "\nverdict: same behaviour (new fingerprint, no value changed)\n" in diff.stdout
    # The block ends the output: its last line says the verdict in words.
    last = diff.stdout.rstrip().splitlines()[-1]
    assert last.startswith("PASS: same behaviour (new fingerprint, no value changed); ")


def test_skip_final_recompute_is_measured_where_a_tree_declares_it():
    # Megatron-LM #4921 (not merged) adds TransformerConfig.skip_final_recompute: the probe plans
    # its rows from the tree's own config and measures what the field does to each unit.
    try:
        _, pr_head = pull_request_trees(4921)
    except LookupError as exc:
        pytest.skip(f"no Megatron-LM pull request #4921: {exc}")
    probe = harness_on(pr_head, "probe", "--model", "dense-deep", "--precision", "fp32", "--json")
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


def _block(stdout: str) -> list[str]:
    """The verdict block: the lines from its '== ' header to the end."""
    lines = stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("== probe "))
    return lines[start:]


def test_an_edit_that_makes_core_attn_inactive_is_named_on_the_screen(tmp_path):
    # Only change: attention never wraps core attention in its checkpoint.
    copy = edited_tree(
        tmp_path,
        "transformer/attention.py",
        'and "core_attn" in self.config.recompute_modules\n',
        'and "core_attn" in self.config.recompute_modules\n            and False\n',
    )
    probe = harness_on(
        copy,
        "probe",
        "--model",
        "dense-tiny",
        "--precision",
        "fp32",
        "--check-golden",
        "--jobs",
        "1",
    )
    assert probe.returncode == 1, probe.stdout[-3000:] + probe.stderr[-2000:]
    block = _block(probe.stdout)
    text = "\n".join(block)
    # The golden of 0.19.2 was found and judged: no "missing golden" preamble, whose it was said once.
    assert "no CPU golden" not in text
    assert text.count("judged against the golden(s) of another fingerprint of ") == 1
    first = next(line.strip() for line in block if line.strip().startswith("first: "))
    assert first.startswith("first: dense-tiny: core_attn: ")
    assert block[-1].startswith("FAIL: 1 of 1 golden(s) differ; first: dense-tiny: core_attn: ")
    changed = next(line for line in block if line.startswith("changed "))
    assert changed.split(maxsplit=1)[1].startswith("core_attn: inactive on dense-tiny (replayed ")
    assert len(block) <= 25


def test_an_edit_only_the_pipeline_sees_fails_the_main_job_by_label(tmp_path):
    # Full recompute skipped on every stage but the first: a single-process probe (one stage, the
    # first) cannot see it; the PP 2 probe's second stage can.
    copy = edited_tree(
        tmp_path,
        "transformer/transformer_block.py",
        "if self.config.recompute_granularity == 'full' and self.training:",
        "if self.config.recompute_granularity == 'full' and self.training and self.pre_process:",
    )
    probe = harness_on(copy, "probe", "--all", "--check-golden")
    assert probe.returncode == 1, probe.stdout[-3000:] + probe.stderr[-2000:]
    block = _block(probe.stdout)
    text = "\n".join(block)
    # Every golden of 0.19.2 was judged: the pipeline's among them, none left listed.
    judged = next(line for line in block if line.startswith("judged "))
    assert "PP 2 of dense-deep" in judged and "TP 2 + SP of " in judged
    assert "x 2 attention back ends (unfused, fused)" in judged
    assert "not judged" not in text
    first = next(line.strip() for line in block if line.strip().startswith("first: "))
    assert first.startswith("first: dense-deep (PP 2 stage 1): full-"), first
    changed = [line.split(maxsplit=1)[-1] for line in block if line.startswith(("changed ", " "))]
    assert any(line.startswith("full-") and " on dense-deep" in line for line in changed), text
    assert len(block) <= 25
