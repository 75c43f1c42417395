"""The GPU tier's gates (tests/support/gates.py), on CPU: what a GPU test needs is named exactly
(issue 24 item 2: an image whose Bridge is older imports fine and then lacks the recipes and callbacks)."""

from __future__ import annotations

import pytest
from gates import BRIDGE_VERSION, missing, version_gap

from harness.run.recipes import importable


def test_bridges_version_is_checked_against_the_projects_pin():
    assert BRIDGE_VERSION == "0.6.2"  # pyproject.toml's bridge extra: megatron-bridge==0.6.2
    # Another release of an installed distribution is named (here the real megatron-core of .venv).
    assert version_gap("megatron-core", "0.20.0") == "megatron-core 0.19.2 is installed"
    assert version_gap("megatron-core", "0.19.2") is None


@pytest.mark.skipif(importable("megatron.bridge"), reason="Megatron Bridge is installed here")
def test_a_machine_without_bridge_is_told_which_bridge_the_tests_need():
    assert missing(gpus=0, bridge=True) == (
        "needs Megatron Bridge 0.6.2: megatron-bridge is not installed"
    )
