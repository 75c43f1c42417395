"""The container boundary: pre-launch checks and revision pins come from where the ranks run.

A container is stood in for by what makes one different from the runner's host: an interpreter whose
``import megatron.core`` loads another release (a real megatron-core 0.19.0 wheel overlaid first on
``PYTHONPATH``, ``tests/support/overlays.py``). The ranks are real torchrun workers on gloo (the 2-node
CPU recipe: one torchrun per "node", so one node can be given the overlay and the other not); the
first sweep is also the runner's 2-node rendezvous test."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from overlays import overlay

from harness.commands import run as run_command
from harness.config.revisions import collect_revisions
from harness.record.model import PIN_KEYS
from harness.run.assemble import StackDisagreement
from harness.run.preflight import read_stack
from harness.run.recipes import Recipe, load_recipe
from harness.run.runner import Launcher, run_sweep, sweep_rows
from harness.run.slurm import SlurmOptions, sbatch_script
from harness.run.torchrun import processes_with_token

# Multi-node torchrun sweeps (~30 s of CPU): .ci/run's "sweeps" step, outside the tier's 150 s.
pytestmark = pytest.mark.sweeps

OTHER_RELEASE = "0.19.0"  # the venv pins 0.19.2 (ci/constraints-cpu.txt)


def overlaid_path(mcore: Path) -> str:
    return os.pathsep.join(filter(None, [str(mcore), os.environ.get("PYTHONPATH")]))


@dataclass(frozen=True)
class OverlaidNodes(Launcher):
    """The local launcher, with the nodes named in ``overlaid`` started in another stack (as an image
    with another megatron-core would start them)."""

    pythonpath: str = ""
    overlaid: tuple[int, ...] = ()

    def commands(self, recipe: Recipe, row_dir: Path, rdzv_id: str) -> list[list[str]]:
        commands = super().commands(recipe, row_dir, rdzv_id)
        return [
            ["env", f"PYTHONPATH={self.pythonpath}", *command] if node in self.overlaid else command
            for node, command in enumerate(commands)
        ]


def parse_run(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    words = shlex.split(line.split(" || ")[0])
    return parser.parse_args(words[words.index("run") + 1 :])


def test_sbatch_script_runs_the_preflight_inside_the_container_before_the_runner(tmp_path):
    recipe = load_recipe("nemotron-3-nano-full-16gpu")
    options = SlurmOptions(container_image="nvcr.io#nvidia/nemo:26.02")
    script = sbatch_script(recipe, tmp_path / "out", ["[]", "moe"], options, tmp_path / "work")
    lines = script.splitlines()
    (check,) = [line for line in lines if line.startswith("srun ")]
    (runner,) = [line for line in lines if line.startswith("recompute-harness run")]
    assert lines.index(check) < lines.index(runner)
    words = shlex.split(check.split(" || ")[0])
    # one task, in the image, with the image's python: the stack the ranks will import is the one checked
    assert words[:3] == ["srun", "--nodes=1", "--ntasks=1"]
    assert "--container-image=nvcr.io#nvidia/nemo:26.02" in words
    assert words[words.index("python") : words.index("python") + 4] == [
        "python",
        "-m",
        "harness.cli",
        "run",
    ]
    checked, launched = parse_run(check), parse_run(runner)
    assert checked.preflight_only == launched.preflighted  # the runner takes what the step wrote
    assert checked.srun_arg == [] and launched.srun_arg[0].startswith("--container-image=")
    assert (checked.recipe, checked.rows, checked.launcher) == (
        launched.recipe,
        launched.rows,
        "slurm",
    )
    # A refusal fails the job there, in one line, before any row's srun step.
    assert check.endswith('--preflight-only "$PREFLIGHT" || exit 2')
    # Without an image the batch node's python is the ranks': no separate step.
    plain = sbatch_script(recipe, tmp_path / "out", ["[]"], SlurmOptions(), tmp_path / "work")
    assert "--preflight" not in plain and not any(
        line.startswith("srun ") for line in plain.splitlines()
    )


def test_the_in_container_preflight_refuses_in_one_line(tmp_path):
    """The step the script runs, for real in this interpreter: a GPU recipe on this CPU machine."""
    recipe = load_recipe("nemotron-3-nano-full-16gpu")
    options = SlurmOptions(container_image="img")
    script = sbatch_script(recipe, tmp_path, ["[]"], options, tmp_path)
    (check,) = [line for line in script.splitlines() if line.startswith("srun ")]
    line = check.split(" || ")[0].replace('"$HEAD:', '"node-a:')
    words = shlex.split(line.replace('"$PREFLIGHT"', shlex.quote(str(tmp_path / "preflight.json"))))
    command = [sys.executable, *words[words.index("python") + 1 :]]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "needs megatron.bridge" in done.stderr
    assert not (tmp_path / "preflight.json").exists()


@pytest.mark.slow
def test_records_carry_the_stack_the_ranks_ran_not_the_runners(tmp_path):
    mcore = overlay(OTHER_RELEASE)
    recipe = load_recipe("cpu-moonlight-ep2-2node")
    pins = tmp_path / "preflight.json"
    # The "container": every check and the stack it writes come from the overlaid interpreter.
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--recipe", recipe.name]
        + ["--out", str(tmp_path), "--preflight-only", str(pins)],
        env={**os.environ, "PYTHONPATH": overlaid_path(mcore)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    contained = read_stack(pins, recipe, sweep_rows(recipe, None))
    assert contained["megatron_core"]["version"] == OTHER_RELEASE
    assert collect_revisions()["megatron_core"] != contained["megatron_core"]
    launcher = OverlaidNodes(
        preflight_revisions=contained, pythonpath=overlaid_path(mcore), overlaid=(0, 1)
    )
    _, (result,) = run_sweep(recipe, tmp_path / "sweep", launcher=launcher)
    assert result.record.revisions.pins() == {key: contained[key] for key in PIN_KEYS}
    # The same sweep is the 2-node c10d rendezvous on localhost (one torchrun per node).
    assert result.outcome.status == "completed", result.outcome.message
    assert sorted(p.name for p in result.row_dir.glob("launcher*.log")) == [
        "launcher0.log",
        "launcher1.log",
    ]
    for node in (0, 1):  # each node's torchrun kept its one rank's logs
        assert len(list(result.row_dir.glob(f"torchrun/node{node}/*/attempt_0/0/stdout.log"))) == 1
    assert result.record.workload.extra["nnodes"] == "2"
    assert result.record.workload.parallelism.ep == 2
    assert processes_with_token(result.launch.token) == []


@pytest.mark.slow
def test_ranks_on_different_stacks_are_refused_by_name(tmp_path):
    mcore = overlay(OTHER_RELEASE)
    recipe = load_recipe("cpu-moonlight-ep2-2node")
    launcher = OverlaidNodes(pythonpath=overlaid_path(mcore), overlaid=(1,))
    with pytest.raises(
        StackDisagreement, match=r"rank 1 and rank 0 ran different stacks"
    ) as refused:
        run_sweep(recipe, tmp_path, launcher=launcher)
    assert OTHER_RELEASE in str(refused.value) and "\n" not in str(refused.value)
    # No record carries a mixed stack's pins; the ranks' evidence stays for the reader.
    (sweep,) = tmp_path.iterdir()
    assert list((sweep / "records").glob("*.json")) == []
    assert (sweep / "rows" / "control" / "events" / "rank1.jsonl").stat().st_size > 0
