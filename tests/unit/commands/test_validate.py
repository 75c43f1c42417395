"""``recompute-harness validate``: exit codes, JSON, bad input, and the python -O refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["validate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_accepted_json_holds_effective_fields(capsys):
    code, out, _ = _run(capsys, "--granularity", "selective", "--modules", "", "--json")
    assert code == 0
    assert json.loads(out) == {
        "accepted": True,
        "rule": None,
        "message": None,
        "effective": {
            "recompute_granularity": "selective",
            "recompute_modules": [],
            "recompute_method": None,
            "recompute_num_layers": None,
        },
    }


def test_rejected_prints_rule_and_mcores_message(capsys):
    code, out, _ = _run(capsys, "--granularity", "selective", "--modules", "core_attn,bogus")
    assert code == 1
    assert "[labels.unknown]" in out and "Invalid choices for recompute_modules" in out


def test_full_with_labels_says_they_are_superseded(capsys):
    code, out, _ = _run(
        capsys,
        "--granularity",
        "full",
        "--method",
        "block",
        "--num-layers",
        "1",
        "--modules",
        "mlp",
        "--json",
    )
    result = json.loads(out)
    assert (
        code == 0
        and result["rule"] == "semantics.full-supersedes-selective"
        and "supersedes" in result["message"]
    )


def test_set_coerces_by_field_type(capsys):
    code, out, err = _run(
        capsys,
        "--granularity",
        "selective",
        "--modules",
        "moe_act",
        "--set",
        "num_moe_experts=4",
        "--set",
        "moe_grouped_gemm=true",
        "--set",
        "add_bias_linear=false",
        "--set",
        "pipeline_model_parallel_size=2",
        "--set",
        "pipeline_dtype=bfloat16",
        "--set",
        "fp8_recipe=tensorwise",
        "--set",
        "moe_layer_freq=1",
        "--json",
    )
    # Accepted, not exit 2: every value reached TransformerConfig as its field's type (a "true" left a
    # string, or "2" for a PP size, would be refused with a reason on stderr instead).
    assert code == 0 and "recompute-harness: error" not in err, err
    assert json.loads(out) == {
        "accepted": True,
        "rule": None,
        "message": None,
        "effective": {
            "recompute_granularity": "selective",
            "recompute_modules": ["moe_act"],
            "recompute_method": None,
            "recompute_num_layers": None,
        },
    }
    code, out, _ = _run(
        capsys,
        "--granularity",
        "selective",
        "--modules",
        "shared_experts",
        "--set",
        "num_moe_experts=4",
        "--set",
        "moe_shared_expert_intermediate_size=64",
        "--set",
        "moe_shared_expert_overlap=yes",
        "--set",
        "moe_token_dispatcher_type=alltoall",
    )
    assert code == 1 and "[labels.shared_experts-vs-shared-expert-overlap]" in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--set", "no_such_field=1"], "has no field"),
        (["--set", "q_lora_rank=8"], "multi_latent_attention=true"),
        (["--set", "num_layers=four"], "num_layers"),
        (["--set", "hidden_dropout"], "field=value"),
        (["--set", "bf16=maybe"], "true or false"),
        (["--set", "fp8_recipe=slow"], "expected one of"),
        (["--set", "init_method=normal"], "cannot be set"),
        (["--set", "recompute_method=block"], "--method"),
        (["--modules", "mlp, core_attn", "--granularity", "selective"], "no spaces"),
        (["--modules", "mlp,,core_attn", "--granularity", "selective"], "non-empty"),
        (["--num-layers", "one"], "invalid int"),
        (["--granularity", "selective\udcff"], "UTF-8"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, fragment):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("recompute-harness: error:") and err.count("\n") == 1 and fragment in err


def test_non_utf8_argument_from_the_shell_is_refused():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, "-m", "harness.cli", "validate", "--granularity", b"selective\xff"],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert (
        result.returncode == 2
        and b"not valid UTF-8" in result.stderr
        and b"Traceback" not in result.stderr
    )


def test_optimized_python_is_refused_because_asserts_vanish():
    result = subprocess.run(
        [
            sys.executable,
            "-O",
            "-m",
            "harness.cli",
            "validate",
            "--granularity",
            "selective",
            "--modules",
            "bogus",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "-O" in result.stderr and "assert" in result.stderr and "Traceback" not in result.stderr
