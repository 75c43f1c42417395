"""``recompute-harness probe``: bad input is one line and exit 2; a small probe prints the table."""

from __future__ import annotations

import pytest

from harness.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["probe", "--model", "llama-huge"], "unknown model 'llama-huge'"),
        (
            ["probe", "--model", "dense-tiny", "--modules", "core_attn+not_a_label"],
            "unknown recompute label(s) not_a_label",
        ),
        (["probe", "--model", "dense-tiny", "--seq-length", "0"], "--seq-length must be in"),
        (["probe", "--model", "dense-tiny", "--micro-batch-size", "many"], "invalid int value"),
        (
            ["probe", "--all", "--modules", "core_attn", "--check-golden"],
            "goldens cover the full probe matrix",
        ),
        (["probe", "--all", "--hang-timeout", "-1"], "--hang-timeout must be in (0, 600] seconds"),
        (["probe"], "one of the arguments --model --all --list is required"),
        (["probe", "--model", "dense-tiny", "--precision", "fp8"], "invalid choice: 'fp8'"),
        (["probe", "--all", "--jobs", "0"], "--jobs must be at least 1, got 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("recompute-harness: error: ")


def test_probe_prints_the_table(capsys):
    assert (
        main(
            [
                "probe",
                "--model",
                "dense-tiny",
                "--modules",
                "core_attn",
                "moe",
                "--attribution",
                "--precision",
                "fp32",
                "--details",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| `core_attn` |" in out and "| `moe` |" in out and "inactive" in out
    assert "where the retained activation bytes are" in out


def test_probe_json(capsys, tmp_path):
    import json

    # --jobs 1: in this process (the passes on workers: tests/unit/probe/workers/test_passes.py, sweeps).
    argv = ["probe", "--model", "nemotron-tiny", "--modules", "mlp", "--json", "--jobs", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    # One pass per precision (the default is every precision), fp32 first.
    assert [probe["precision"] for probe in data] == ["fp32", "bf16"]
    assert [row["status"] for row in data[0]["rows"]] == ["control", "inactive"]
    # Fed to analyze (a natural mistake), the refusal says what to use instead.
    (tmp_path / "probe.json").write_text(out)
    assert main(["analyze", str(tmp_path / "probe.json")]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "is `probe --json` output" in err and "probe --check-golden" in err
    )
