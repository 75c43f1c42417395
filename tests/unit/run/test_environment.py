"""The environment that changes what a row measures: which variables are recorded, a row started with
exactly its declared ones, and a process's environment kept across an in-process Bridge validation
(issue 36, defect 3 and item 5)."""

from __future__ import annotations

import json
import os
import sys

from harness.run.environment import (
    declared_environment,
    environment_differences,
    preserved_environment,
    recorded_environment,
)
from harness.run.torchrun import run_row

# The defaults Bridge 0.6.2's Moonlight recipe applies (recipes/moonlight/h100/moonlight_16b.py and
# recipes/utils/environment_utils.py), and variables that change nothing the record measures.
BRIDGE_DEFAULTS = {
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CUDA_DEVICE_MAX_CONNECTIONS": "32",
    "NVTE_FWD_LAYERNORM_SM_MARGIN": "20",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8",
    "USE_MNNVL": "0",
}
UNRELATED = {"HOME": "/root", "CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_DRIVER_CAPABILITIES": "all"}


def test_the_recorded_variables_are_allocator_dispatcher_kernel_and_graph_ones():
    assert recorded_environment({**UNRELATED, **BRIDGE_DEFAULTS}) == dict(
        sorted(BRIDGE_DEFAULTS.items())
    )


def test_a_row_is_declared_with_torchruns_own_default():
    # torchrun's agent gives each worker TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless the launcher set it.
    assert declared_environment(UNRELATED) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert declared_environment({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}) == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"
    }


def test_a_preserved_environment_undoes_what_bridges_defaults_wrote(monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    before = dict(os.environ)
    with preserved_environment():
        for name, value in BRIDGE_DEFAULTS.items():
            os.environ.setdefault(name, value)  # apply_environment_variables' own rule
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
    assert dict(os.environ) == before


def test_a_row_gets_exactly_its_declared_environment_whatever_was_set_since(tmp_path, monkeypatch):
    # What an in-process Bridge validation left in os.environ before the fix (defect 3) never reaches a
    # row declared before it: recorded variables come from the declaration, the rest from os.environ.
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    declared = declared_environment(os.environ)
    for name, value in BRIDGE_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HARNESS_TEST_UNRELATED", "kept")
    seen = tmp_path / "seen.json"
    script = f"import json, os; json.dump(dict(os.environ), open({str(seen)!r}, 'w'))"
    launch = run_row(
        tmp_path,
        [[sys.executable, "-c", script]],
        world_size=1,
        timeout_s=60,
        stall_timeout_s=60,
        declared=declared,
    )
    assert launch.returncodes == [0]
    child = json.loads(seen.read_text())
    assert recorded_environment(child) == declared
    assert declared["NCCL_DEBUG"] == "WARN" and child["HARNESS_TEST_UNRELATED"] == "kept"


def test_differences_name_each_variable_with_both_values():
    assert environment_differences(
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_DEBUG": "WARN"},
        {"NCCL_DEBUG": "WARN", "CUDA_DEVICE_MAX_CONNECTIONS": "32"},
    ) == [
        "CUDA_DEVICE_MAX_CONNECTIONS <unset> -> 32",
        "PYTORCH_CUDA_ALLOC_CONF expandable_segments:True -> <unset>",
    ]
