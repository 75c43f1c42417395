"""One-line edits of the installed Megatron Core that break recompute, judged as a Megatron Core
developer would meet them: ``moe_act``'s checkpoint skipped or no longer discarding its output, and
the checkpoint classes themselves broken (``CheckpointWithoutOutput`` keeping its output,
``CheckpointFunction`` not restoring the RNG state). Each is a finding of ``probe --check-golden``
(exit 1, the labels named) and of ``diff``, never a refusal of the adapter (exit 2). Outside the CPU
tier's budget: .ci/run's ``unreleased`` step."""

from __future__ import annotations

from pathlib import Path

import pytest
from overlays import edited_tree, harness_on, installed_tree

pytestmark = [pytest.mark.slow, pytest.mark.unreleased]

EXPERTS = Path("transformer/moe/experts.py")
RANDOM = Path("tensor_parallel/random.py")


def check_golden(tree: Path, model: str = "moonlight-tiny"):
    return harness_on(
        tree, "probe", "--model", model, "--precision", "fp32", "--check-golden", "--jobs", "1",
        "--details",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # The checkpoint skipped: TEGroupedMLP never reads moe_act.
        (
            "        self.activation_recompute = (\n",
            "        self.activation_recompute = False and (\n",
        ),
        # The checkpoint runs but no longer discards its output after linear_fc2 saved it.
        (
            "            self.activation_checkpoint.discard_output_and_register_recompute(output)\n",
            "            pass\n",
        ),
    ],
    ids=["skipped", "not-discarding"],
)
def test_a_broken_moe_act_is_named_by_the_golden_check_and_by_diff(tmp_path, old, new):
    tree = edited_tree(tmp_path, EXPERTS, old, new)
    probe = check_golden(tree)
    assert probe.returncode == 1, probe.stdout[-3000:] + probe.stderr[-2000:]
    assert "  moe_act: " in probe.stdout, probe.stdout[-3000:]
    diff = harness_on(None, "diff", "--model", "moonlight-tiny", str(installed_tree()), str(tree))
    assert diff.returncode == 1, diff.stdout[-3000:] + diff.stderr[-2000:]
    assert "moe_act" in diff.stdout


def test_a_checkpoint_without_output_that_keeps_its_output_is_judged_not_refused(tmp_path):
    tree = edited_tree(
        tmp_path, RANDOM, "            output.untyped_storage().resize_(0)\n", "            pass\n"
    )
    probe = check_golden(tree)
    assert probe.returncode == 1, probe.stdout[-3000:] + probe.stderr[-2000:]
    assert "refusing" not in probe.stdout + probe.stderr
    assert (
        "Megatron Core's CheckpointWithoutOutput kept its output's storage (no discard happened); "
        "the rows relying on CheckpointWithoutOutput: layernorm, mla_up_proj, moe_act, gdn_norm_out"
    ) in probe.stdout
    assert "  moe_act: " in probe.stdout  # and the golden rows that moved


def test_a_checkpoint_function_that_does_not_restore_the_rng_is_judged_not_refused(tmp_path):
    tree = edited_tree(
        tmp_path,
        RANDOM,
        "            _set_all_rng_states(*ctx.rng_states)\n",
        "            pass\n",
    )
    probe = check_golden(tree, "dense-tiny")
    assert probe.returncode == 1, probe.stdout[-3000:] + probe.stderr[-2000:]
    assert "refusing" not in probe.stdout + probe.stderr
    finding = next(
        line
        for line in probe.stdout.splitlines()
        if line.startswith("Megatron Core's CheckpointFunction does not replay dropout bitwise")
    )
    assert finding.endswith(
        "the rows relying on CheckpointFunction: core_attn, mlp, moe, shared_experts, full recompute"
    )
    # and the golden rows whose dropout replay is no longer bitwise
    assert "  core_attn: dropout_not_bitwise_values 0 -> " in probe.stdout
    assert "  full-uniform-1: dropout_not_bitwise_values 0 -> " in probe.stdout
