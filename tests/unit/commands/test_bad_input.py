"""One line and exit 2 for bad input and write failures, before anything is written or launched;
outputs that exist and were not written by the command are never overwritten unless --force."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from record_samples import run_record, write_records

from harness.cli import main


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_analyze_plot_never_overwrites_a_record(tmp_path, capsys):
    paths = write_records(tmp_path, run_record(), run_record("moe_act"))
    before = open(paths[1], "rb").read()  # noqa: SIM115
    assert main(["analyze", paths[0], "--plot", paths[1]]) == 2
    assert "refusing to overwrite" in _err(capsys)
    assert open(paths[1], "rb").read() == before  # noqa: SIM115
    assert main(["analyze", paths[0], "--plot", str(tmp_path)]) == 2
    assert "is a directory" in _err(capsys)


@pytest.mark.parametrize(
    "flags, problem",
    [
        (["--partition", "gpu\necho INJECTED"], "not a slurm name"),
        (["--account", "a;b"], "not a slurm name"),
        (["--time", "x; rm -rf /"], "slurm time limit"),
        (["--setup", "source a\necho INJECTED"], "one shell line"),
    ],
)
def test_launch_refuses_values_that_would_change_the_script(tmp_path, capsys, flags, problem):
    script = tmp_path / "job.sbatch"
    assert (
        main(
            [
                "launch",
                "--slurm",
                "--recipe",
                "moonlight-full-8gpu",
                "--script",
                str(script),
                *flags,
            ]
        )
        == 2
    )
    assert problem in _err(capsys)
    assert not script.exists()


def test_launch_script_never_overwrites_a_record_but_replaces_its_own(tmp_path, capsys):
    (record,) = write_records(tmp_path, run_record())
    before = open(record, "rb").read()  # noqa: SIM115
    assert main(["launch", "--slurm", "--recipe", "moonlight-full-8gpu", "--script", record]) == 2
    assert "refusing to overwrite" in _err(capsys)
    assert open(record, "rb").read() == before  # noqa: SIM115
    script = tmp_path / "job.sbatch"
    for _ in range(2):  # the second run replaces the script the first one wrote
        assert (
            main(
                [
                    "launch",
                    "--slurm",
                    "--recipe",
                    "moonlight-full-8gpu",
                    "--script",
                    str(script),
                    "--partition",
                    "gpu",
                ]
            )
            == 0
        )
    assert "#SBATCH --partition=gpu" in script.read_text()


def test_empty_golden_dir_and_unreadable_inputs_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = write_records(tmp_path, run_record())
    assert main(["golden", "refresh", "--golden-dir", "", *paths]) == 2
    assert "empty path" in _err(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records"]
    assert main(["compare", "--golden", "/dev/zero", *paths]) == 2
    assert "not a regular file" in _err(capsys)
    (tmp_path / "golden-file").write_text("")
    assert main(["golden", "refresh", "--golden-dir", str(tmp_path / "golden-file"), *paths]) == 2
    assert "not a directory" in _err(capsys)


def test_unwritable_step_summary_is_refused_before_the_golden_is_written(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))  # a directory
    paths = write_records(tmp_path, run_record())
    assert main(["golden", "refresh", "--golden-dir", str(tmp_path / "golden"), *paths]) == 2
    assert "GITHUB_STEP_SUMMARY" in _err(capsys)
    assert not (tmp_path / "golden").exists()


def test_run_refuses_bad_faults_and_timeouts_before_launching(tmp_path, capsys, monkeypatch):
    out = tmp_path / "runs"
    monkeypatch.setenv("RECOMPUTE_HARNESS_FAULT", "garbage")
    assert (
        main(["run", "--recipe", "cpu-moonlight-ep2", "--rows", "moe_act", "--out", str(out)]) == 2
    )
    assert "kind must be one of" in _err(capsys)
    monkeypatch.delenv("RECOMPUTE_HARNESS_FAULT")
    assert (
        main(
            [
                "run",
                "--recipe",
                "cpu-moonlight-ep2",
                "--rows",
                "moe_act",
                "--out",
                str(out),
                "--inject-fault",
                "oom:row=layernorm",
            ]
        )
        == 2
    )
    assert "not in this sweep" in _err(capsys)
    assert (
        main(["run", "--recipe", "cpu-moonlight-ep2", "--out", str(out), "--timeout", "inf"]) == 2
    )
    assert "finite" in _err(capsys)
    assert not out.exists()


@pytest.mark.slow
def test_a_closed_stdout_is_not_an_error(tmp_path):
    paths = write_records(tmp_path, run_record(), run_record("moe_act"))
    reader_gone = subprocess.run(
        [
            "bash",
            "-c",
            'set -o pipefail; "$0" -m harness.cli analyze "$@" | true',
            sys.executable,
            *paths,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=120,
        check=False,
    )
    assert reader_gone.returncode == 0 and "Traceback" not in reader_gone.stderr, reader_gone.stderr


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--model", "dense-deep", "--pipeline-parallel", "8"], "larger than its 4 layers"),
        (["--model", "dense-deep", "--pipeline-parallel", "3"], "do not split evenly"),
        (["--model", "dense-deep", "--pipeline-parallel", "1"], "must be in [2, 8]"),
        (["--model", "mtp-tiny", "--pipeline-parallel", "2"], "Multi-Token Prediction"),
        (["--model", "nemotron-h-tiny", "--pipeline-parallel", "2"], "hybrid model"),
        (["--all", "--pipeline-parallel", "2"], "drop --all"),
        (["--model", "dense-deep", "--pipeline-parallel", "2", "--modules", "core_attn"], "drop"),
        # nemotron-tiny has 2 query groups (harness/models/moe.py): a TP 4 group cannot split them.
        (["--model", "nemotron-tiny", "--tensor-parallel", "4"], "num_query_groups 2 does not"),
        # dense-tiny's 4 attention heads over 8 ranks.
        (["--model", "dense-tiny", "--tensor-parallel", "8"], "num_attention_heads 4 does not"),
        (["--model", "dense-tiny", "--tensor-parallel", "1"], "must be in [2, 8]"),
        (["--model", "nemotron-h-tiny", "--tensor-parallel", "2"], "hybrid model"),
        (["--all", "--tensor-parallel", "2"], "drop --all"),
        (["--model", "dense-tiny", "--tensor-parallel", "2", "--seq-length", "64"], "drop"),
    ],
)
def test_probe_refuses_a_multi_rank_layout_it_cannot_build(tmp_path, capsys, argv, problem):
    # Pipeline and TP layouts: refused in one line before any rank starts or any golden directory is
    # touched.
    golden_dir = tmp_path / "goldens"
    assert main(["probe", *argv, "--write-golden", "--golden-dir", str(golden_dir)]) == 2
    assert problem in _err(capsys)
    assert not golden_dir.exists()
