"""Recipes, rows, faults, classification and the slurm script: everything the runner decides before
(or after) a launch, checked without launching anything."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from harness.cli import main
from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.run.assemble import build_record
from harness.run.classify import Classification, against_control, classify
from harness.run.events import EventWriter, RankEvidence, events_path, read_rank
from harness.run.faults import parse_fault
from harness.run.recipes import (
    Parallelism,
    Recipe,
    check_layout,
    check_packages,
    check_recipe,
    import_failure,
    load_recipe,
    recipe_names,
    with_world,
)
from harness.run.runner import sweep_rows
from harness.run.slurm import SlurmOptions, sbatch_script
from harness.run.torchrun import LaunchResult, local_commands, slurm_command


def test_every_recipe_loads_and_starts_with_the_control():
    names = recipe_names()
    assert {
        "moonlight-full-8gpu",
        "nemotron-3-nano-full-16gpu",
        "cpu-moonlight-ep2",
        "cpu-moonlight-ep2-2node",
    } <= set(names)
    recipes = [load_recipe(name) for name in names]
    assert [recipe.name for recipe in recipes if recipe.rows[0] != "[]"] == []
    gpu_sizes = {recipe.world_size for recipe in recipes if recipe.device == "cuda"}
    assert {1, 2, 8, 16} <= gpu_sizes


def test_bridge_back_end_imports_without_bridge_and_has_a_builder_for_every_bridge_recipe():
    # CI has no Bridge: the back end must keep its Bridge imports inside the GPU-side functions.
    from harness.run import backend_bridge
    from harness.run.recipes import BRIDGE_RECIPES

    assert set(backend_bridge.RECIPES) == set(BRIDGE_RECIPES)


def test_full_size_recipes_match_the_seed_studies():
    moonlight = load_recipe("moonlight-full-8gpu")
    assert (
        moonlight.world_size,
        moonlight.seq_length,
        moonlight.global_batch_size,
        moonlight.train_iters,
    ) == (8, 4096, 4, 20)
    assert moonlight.parallelism.record_layout(8).to_json() == {
        "tp": 2,
        "pp": 1,
        "cp": 1,
        "ep": 8,
        "dp": 4,
        "expert_dp": 1,
        "vpp": None,
    }
    assert moonlight.steady_window == (11, 20)
    nemotron = load_recipe("nemotron-3-nano-full-16gpu")
    assert (
        nemotron.nnodes,
        nemotron.world_size,
        nemotron.seq_length,
        nemotron.global_batch_size,
        nemotron.train_iters,
    ) == (2, 16, 8192, 16, 12)
    assert nemotron.parallelism.record_layout(16).to_json() == {
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "ep": 8,
        "dp": 16,
        "expert_dp": 2,
        "vpp": None,
    }


@pytest.mark.parametrize(
    "layout, world, problem",
    [
        (Parallelism(tp=2, ep=8), 8, "expert layout ETP2 x EP8"),  # etp defaults to tp, as in MCore
        (Parallelism(tp=3), 8, "TP3 x PP1 x CP1 = 3 does not divide 8"),
        (Parallelism(ep=4), 2, "does not divide 2 ranks"),
        (Parallelism(vpp=2), 4, "virtual pipeline"),
        (Parallelism(tp=0), 4, "positive integer"),
    ],
)
def test_impossible_layouts_are_refused(layout, world, problem):
    with pytest.raises(UsageError, match=problem):
        check_layout(layout, world, "recipe 'x'")


def test_unknown_recipe_and_missing_package_are_one_line_errors():
    with pytest.raises(UsageError, match="unknown recipe 'nope'.*moonlight-full-8gpu"):
        load_recipe("nope")
    values = load_recipe("cpu-moonlight-ep2").as_dict()
    values["requires"] = ["no_such_module_for_recompute_harness"]
    with pytest.raises(
        UsageError, match="needs no_such_module_for_recompute_harness, which is not installed"
    ):
        check_packages(Recipe.from_dict(values))


def test_an_installed_package_that_fails_to_import_is_refused_with_its_error(tmp_path, monkeypatch):
    # Found is not importable: a Transformer Engine that cannot load cuDNN raises at import, like this one.
    package = tmp_path / "extension_without_its_library"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('cudnn shared object not found.')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert import_failure(["json", "extension_without_its_library"]) == (
        "extension_without_its_library",
        "RuntimeError: cudnn shared object not found.",
    )
    values = load_recipe("mcore-moonlight-1gpu").as_dict()
    values["requires"] = ["extension_without_its_library"]
    with pytest.raises(
        UsageError,
        match="installed but does not import: RuntimeError: cudnn shared object not found",
    ):
        check_packages(Recipe.from_dict(values))


def test_the_record_names_the_gpu_a_rank_reported_and_never_guesses(tmp_path):
    recipe, outcome = (
        load_recipe("mcore-moonlight-1gpu"),
        Classification("crash", 0, "model-build", (0,), "x"),
    )
    writer = EventWriter(tmp_path, 0)
    writer.emit("start", rank=0, world_size=1, pid=1, device="cuda")
    writer.close()
    unnamed = build_record(recipe, "[]", [read_rank(events_path(tmp_path, 0), 0)], outcome)
    assert (unnamed.hardware.device, unnamed.hardware.sm) == ("unidentified", None)
    writer = EventWriter(tmp_path, 0)
    writer.emit("device", name="NVIDIA H100 80GB HBM3", sm="9.0")
    writer.close()
    named = build_record(recipe, "[]", [read_rank(events_path(tmp_path, 0), 0)], outcome)
    assert (named.hardware.device, named.hardware.sm, named.hardware.gpu_count) == (
        "H100_80GB",
        "9.0",
        1,
    )


def test_mcore_backend_refuses_tensor_parallel():
    values = load_recipe("cpu-moonlight-ep2").as_dict()
    values["parallelism"] = {**values["parallelism"], "tp": 2, "ep": 1}
    with pytest.raises(UsageError, match="data and expert parallel only"):
        check_recipe(Recipe.from_dict(values))


def test_batch_must_split_over_data_parallel():
    with pytest.raises(
        UsageError, match="global batch 4 is not a multiple of micro batch 2 x data parallel 4"
    ):
        with_world(load_recipe("cpu-moonlight-ep2"), nproc_per_node=4)


@pytest.mark.parametrize(
    "name, fields",
    [
        ("[]", RecomputeFields.selective()),
        ("moe_act", RecomputeFields.selective("moe_act")),
        ("layernorm+moe_act", RecomputeFields.selective("layernorm", "moe_act")),
        ("full-uniform-1", RecomputeFields.full("uniform", 1)),
        ("full-block-4", RecomputeFields.full("block", 4)),
    ],
)
def test_row_names_round_trip(name, fields):
    assert RecomputeFields.parse(name) == fields
    assert fields.name == name


@pytest.mark.parametrize(
    "name, problem",
    [
        ("", "expected [] or labels joined by '+'"),
        ("a++b", "expected [] or labels joined by '+'"),
        (" moe", "(non-empty, no spaces)"),
        ("full-uniform", "full rows are spelled full-<method>-<layers>"),
        ("full--x", "full rows are spelled full-<method>-<layers>"),
    ],
)
def test_bad_row_names(name, problem):
    with pytest.raises(UsageError, match=re.escape(f"row {name!r}: ") + ".*" + re.escape(problem)):
        RecomputeFields.parse(name)


def test_fault_specs():
    fault = parse_fault("oom:iteration=2,phase=backward,rank=1,row=[]")
    assert (fault.kind, fault.iteration, fault.phase, fault.rank, fault.row) == (
        "oom",
        2,
        "backward",
        1,
        "[]",
    )
    assert parse_fault(fault.spec()) == fault
    assert fault.applies_to("[]") and not fault.applies_to("moe_act")
    for bad, problem in [
        ("boom", "kind"),
        ("oom:phase=sideways", "phase"),
        ("nan:phase=backward", "forward"),
        ("oom:iteration=x", "integers"),
        ("oom:iteration=0", "count from 1"),
        ("oom:depth=1", "expected"),
    ]:
        with pytest.raises(UsageError, match=problem):
            parse_fault(bad)


def _rank(rank: int, iteration: int, phase: str, **more) -> RankEvidence:
    return RankEvidence(rank=rank, started=True, iteration=iteration, phase=phase, **more)


def test_root_error_wins_over_the_peer_that_lost_its_connection(tmp_path):
    ranks = [
        _rank(
            0,
            3,
            "grad-sync",
            errors=[
                {
                    "t": 1.0,
                    "iteration": 3,
                    "phase": "grad-sync",
                    "type": "RuntimeError",
                    "message": "[gloo] Connection closed by peer",
                }
            ],
        ),
        _rank(
            1,
            3,
            "backward",
            errors=[
                {
                    "t": 2.0,
                    "iteration": 3,
                    "phase": "backward",
                    "type": "OutOfMemoryError",
                    "message": "CUDA out of memory. Tried to allocate 1 GiB",
                }
            ],
        ),
    ]
    launch = LaunchResult([1], 1.0, "token")
    outcome = classify(
        ranks, launch, train_iters=4, row_dir=tmp_path, stall_timeout_s=5, timeout_s=60
    )
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "oom",
        3,
        "backward",
        (1,),
    )


def test_a_collective_timeout_is_a_hang_seen_from_the_waiting_rank(tmp_path):
    ranks = [
        _rank(
            0,
            2,
            "grad-sync",
            errors=[
                {
                    "t": 1.0,
                    "iteration": 2,
                    "phase": "grad-sync",
                    "type": "DistBackendError",
                    "message": "[gloo] Timed out waiting 60000ms for recv operation",
                }
            ],
        ),
        _rank(1, 2, "backward"),
    ]
    outcome = classify(
        ranks,
        LaunchResult([1], 61.0, "token"),
        train_iters=4,
        row_dir=tmp_path,
        stall_timeout_s=300,
        timeout_s=600,
    )
    assert (outcome.status, outcome.iteration, outcome.phase) == ("hang", 2, "grad-sync")


def test_a_stopped_row_is_a_hang_at_the_rank_furthest_behind(tmp_path):
    ranks = [_rank(0, 2, "grad-sync"), _rank(1, 2, "backward")]
    outcome = classify(
        ranks,
        LaunchResult([-15], 9.0, "token", "stall"),
        train_iters=4,
        row_dir=tmp_path,
        stall_timeout_s=5,
        timeout_s=60,
    )
    assert (outcome.status, outcome.iteration, outcome.phase, outcome.ranks) == (
        "hang",
        2,
        "backward",
        (1,),
    )


def test_advanced_but_failed_only_against_a_failed_control():
    control = Classification("oom", 2, "forward", (0,), "control oom")
    later = Classification("oom", 2, "optimizer-step", (1,), "row oom")
    assert against_control(later, control).status == "advanced-but-failed"
    assert "got further than the [] control" in against_control(later, control).message
    assert against_control(Classification("oom", 1, "backward", (0,), "x"), control).status == "oom"
    completed_control = Classification("completed", 4, None, (), "ok")
    assert against_control(later, completed_control).status == "oom"


def test_local_multi_node_commands_share_one_rendezvous(tmp_path):
    node0, node1 = local_commands(tmp_path, 2, 1, "job-1", python="python")
    endpoint = node0[node0.index("--rdzv-endpoint") + 1]
    assert (
        endpoint.startswith("127.0.0.1:") and node1[node1.index("--rdzv-endpoint") + 1] == endpoint
    )
    assert "is_host=true" in node0 and "is_host=false" in node1
    assert node0[:3] == ["python", "-m", "torch.distributed.run"]
    assert node0[-3:] == ["-m", "harness.run.worker", str(tmp_path)]


def test_slurm_job_is_srun_plus_torchrun(tmp_path):
    command = slurm_command(tmp_path, 2, 8, "job-7", "node-a", 29500)
    assert command[0] == "srun" and "--nodes=2" in command and "--ntasks-per-node=1" in command
    shell = command[-1]
    assert (
        "-m torch.distributed.run --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node-a:29500"
        in shell
    )
    assert "node$SLURM_NODEID" in shell
    recipe = load_recipe("nemotron-3-nano-full-16gpu")
    script = sbatch_script(
        recipe, tmp_path, list(recipe.rows), SlurmOptions(partition="batch"), tmp_path
    )
    assert (
        "#SBATCH --nodes=2" in script
        and "#SBATCH --gpus-per-node=8" in script
        and "#SBATCH --partition=batch" in script
    )
    assert "--launcher slurm" in script and '--rdzv-endpoint "$HEAD:29500"' in script
    assert "--rows" not in script


def test_slurm_script_names_chosen_rows_so_run_parses_them_back(tmp_path):
    from harness.commands import run as run_command

    recipe = load_recipe("nemotron-3-nano-full-16gpu")
    for chosen in ([], ["moe"]):  # a control-only sweep too: `--rows` must never be left empty
        rows = sweep_rows(recipe, chosen)
        script = sbatch_script(recipe, tmp_path, rows, SlurmOptions(), tmp_path)
        line = next(
            line for line in script.splitlines() if line.startswith("recompute-harness run")
        )
        parser = argparse.ArgumentParser()
        run_command.add_arguments(parser)
        args = parser.parse_args(shlex.split(line)[2:])
        assert sweep_rows(recipe, args.rows) == rows


@pytest.mark.parametrize(
    "argv, reason",
    [
        (["run", "--recipe", "nope"], "unknown recipe 'nope' (known: cpu-moonlight-ep2, "),
        (
            ["run", "--recipe", "cpu-moonlight-ep2", "--nproc-per-node", "3"],
            "recipe 'cpu-moonlight-ep2': expert layout ETP1 x EP2 x PP1 = 2 does not divide 3 ranks",
        ),
        (
            ["run", "--recipe", "cpu-moonlight-ep2", "--inject-fault", "oom:rank=7"],
            "fault 'oom:iteration=1,phase=forward,rank=7': rank 7 is outside the 2-rank world",
        ),
        (
            ["launch", "--slurm", "--recipe", "cpu-moonlight-ep2"],
            "recipe 'cpu-moonlight-ep2' runs on cpu: slurm launch is for GPU recipes",
        ),
    ],
)
def test_cli_refuses_bad_input_before_launching(tmp_path, capsys, argv, reason):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    # One line, with its reason (torch's import-time warnings may share stderr).
    errors = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("recompute-harness: error: ")
    ]
    assert len(errors) == 1 and reason in errors[0], errors
    assert list(tmp_path.iterdir()) == []  # nothing launched, nothing written


def test_a_recipe_file_anywhere_loads_with_a_packaged_or_relative_base(tmp_path, capsys):
    own = tmp_path / "bridge-repo" / "recipes"
    own.mkdir(parents=True)
    (own / "tiny-base.toml").write_text('base = "cpu-moonlight-ep2"\nrows = ["[]", "core_attn"]\n')
    (own / "my-ep2.toml").write_text(
        'base = "tiny-base.toml"\ntrain_iters = 5\nsteady_window = [2, 5]\n'
    )
    recipe = load_recipe(str(own / "my-ep2.toml"))
    assert recipe.name == "my-ep2"  # records and goldens are named after the file
    assert (
        recipe.rows == ("[]", "core_attn")
        and recipe.train_iters == 5
        and recipe.parallelism.ep == 2
    )
    (own / "typo.toml").write_text('base = "cpu-moonlight-ep2"\ntrain_iter = 5\n')
    (own / "loop.toml").write_text('base = "loop.toml"\n')
    assert main(["run", "--recipe", str(own / "typo.toml"), "--out", str(tmp_path / "out")]) == 2
    assert main(["run", "--recipe", str(own / "loop.toml"), "--out", str(tmp_path / "out")]) == 2
    assert main(["run", "--recipe", str(own / "absent.toml"), "--out", str(tmp_path / "out")]) == 2
    errors = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("recompute-harness: error: ")
    ]
    assert "unknown key(s) train_iter" in errors[0] and "circular base chain" in errors[1]
    assert "absent.toml" in errors[2] and len(errors) == 3
    assert not (tmp_path / "out").exists()


def test_bridge_builders_are_open_through_an_entry_point_group(tmp_path, monkeypatch):
    from harness.run import recipes

    # A Bridge repo's own distribution, as pip would install it: metadata with an entry point.
    dist = tmp_path / "my_bridge_recipes-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-bridge-recipes\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{recipes.ENTRY_POINT_GROUP}]\nllama_tiny = my_recipes:llama_tiny\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert recipes.bridge_recipe_names() == [*recipes.BRIDGE_RECIPES, "llama_tiny"]
    assert recipes.bridge_builders()["llama_tiny"].value == "my_recipes:llama_tiny"


def test_slurm_script_runs_steps_in_a_container_and_compares_after_the_run(tmp_path):
    recipe = load_recipe("nemotron-3-nano-full-16gpu")
    options = SlurmOptions(
        container_image="nvcr.io#nvidia/nemo:25.09",
        container_mounts=("/data:/data",),
        golden_dir=tmp_path / "goldens",
    )
    script = sbatch_script(recipe, tmp_path / "out", list(recipe.rows), options, tmp_path / "work")
    line = next(line for line in script.splitlines() if line.startswith("recompute-harness run"))
    from harness.commands import run as run_command

    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    args = parser.parse_args(shlex.split(line.split(" || ")[0])[2:])
    assert args.srun_arg[0] == "--container-image=nvcr.io#nvidia/nemo:25.09"
    assert (
        f"--container-mounts={tmp_path / 'work'}:{tmp_path / 'work'},{tmp_path / 'out'}:{tmp_path / 'out'},/data:/data"
        in args.srun_arg
    )
    command = slurm_command(
        tmp_path, 2, 8, "job-7", "node-a", 29500, "python", tuple(args.srun_arg)
    )
    assert command.index("--container-image=nvcr.io#nvidia/nemo:25.09") < command.index("bash")
    assert f"recompute-harness compare --golden-dir {tmp_path / 'goldens'}" in script
    assert script.rstrip().endswith('exit "$status"')
