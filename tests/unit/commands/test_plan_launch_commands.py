"""Megatron-LM's own training commands as users type them (its functional-test launch commands at
d98e8a64: gpt, moe, hybrid on 8 GPUs), read by plan's parser: accepted, or refused in one line naming
a feature. Outside the CPU tier: .ci/run's ``revisions`` step."""

from __future__ import annotations

import pytest
from megatron_lm_scripts import mirror_or_skip, script

from harness.errors import UsageError
from harness.estimate.megatron_lm import parse_megatron_lm

# The share of Megatron-LM's functional-test training commands plan accepts (measured: see
# docs/plan.md); a change that refuses more fails here.
ACCEPTED_AT_LEAST = 0.80


@pytest.mark.revisions  # ~8 s: outside the CPU tier, with the other Megatron-LM head checks
def test_megatron_lms_own_training_commands_are_accepted_or_refused_naming_a_feature():
    # Megatron-LM's functional-test launch commands (gpt, moe, hybrid; 8 GPUs), parsed only.
    mirror_or_skip()
    bench = script("megatron_lm_test_cases")
    cases = bench.test_case_commands()
    assert len(cases) > 200
    refusals = [bench.judge(flags) for _, flags in cases]
    accepted = refusals.count(None)
    assert accepted / len(cases) >= ACCEPTED_AT_LEAST
    for refusal in filter(None, refusals):
        assert "\n" not in refusal
        assert "is not modelled" in refusal or "give --vocab-size" in refusal or "flag" in refusal
    # every accepted command builds its model (meta device) and resolves its row on the validator,
    # or is refused in one line (no traceback)
    from harness.plan.parameters import count_parameters, fake_parallel_state
    from harness.plan.plan import resolved_row
    from harness.plan.workload import workload_from_megatron_lm

    built = 0
    for (_, flags), refusal in zip(cases, refusals, strict=True):
        if refusal is not None:
            continue
        try:
            run = parse_megatron_lm(flags, bench.WORLD_SIZE)
            workload = workload_from_megatron_lm(run)
            count_parameters(workload)
            with fake_parallel_state(workload):
                resolved_row(workload, run.given)
        except UsageError as refused:
            assert "\n" not in str(refused)
        else:
            built += 1
    assert built >= accepted - 1  # one: a global batch 8 GPUs cannot divide
