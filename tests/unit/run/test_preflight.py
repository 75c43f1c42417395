"""The bridge sweep's pre-launch check, through its real child process, on a machine without Bridge.
(With Bridge installed, tests/gpu/test_bridge_config.py checks its verdicts on every bridge recipe.)"""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.run.preflight import check_bridge_rows
from harness.run.recipes import importable, load_recipe

pytestmark = pytest.mark.skipif(
    importable("megatron.bridge"), reason="Megatron Bridge is installed here"
)


def test_a_child_that_cannot_run_refuses_the_sweep_in_one_line():
    with pytest.raises(UsageError) as refused:
        check_bridge_rows(load_recipe("moonlight-short-1gpu"), ["[]", "core_attn"])
    message = str(refused.value)
    assert message.startswith("recipe 'moonlight-short-1gpu': Bridge's pre-launch check failed: ")
    assert message.endswith("No module named 'megatron.bridge'") and "\n" not in message


def test_a_child_past_its_timeout_is_killed_and_reported():
    # Without Bridge the child fails in ~0.2 s (it imports Bridge first); 10 ms is less than its start-up.
    with pytest.raises(UsageError, match=r"did not finish in 0\.01 s \(killed\)"):
        check_bridge_rows(load_recipe("moonlight-short-1gpu"), ["[]"], timeout_s=0.01)
