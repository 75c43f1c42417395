"""GPU tier, Bridge half: the ``bridge`` back end's configs, checked by Megatron Bridge itself.

No GPU is needed: Bridge builds its recipes and runs its pre-training validation
(``runtime_config_update``) on the host, and every row's environment is computed as a rank applies it. These tests need Transformer Engine and Megatron Bridge to
import, which means the GPU runners' image, or ``ci/bridge-config-cpu.sh`` on a CPU machine with the
CUDA toolkit (it builds TE's torch extension there), so they live in the ``gpu`` tier.
"""

from __future__ import annotations

import json
import os

import pytest
from gates import require

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.run.environment import (
    declared_environment,
    preserved_environment,
    recorded_environment,
)
from harness.run.preflight import check_bridge_rows
from harness.run.recipes import Recipe, load_recipe, recipe_names

pytestmark = pytest.mark.gpu

BRIDGE_RECIPES = [name for name in recipe_names() if load_recipe(name).backend == "bridge"]


@pytest.fixture(autouse=True)
def _bridge(monkeypatch):
    require(gpus=0, te=True, bridge=True)
    monkeypatch.setenv("WORLD_SIZE", "1")  # replaced per recipe where Bridge needs the world


def _as_worker_sees_it(name: str) -> Recipe:
    # The worker rebuilds the recipe from the row spec's JSON (harness.run.worker).
    return Recipe.from_dict(json.loads(json.dumps(load_recipe(name).as_dict())))


@pytest.mark.parametrize("name", BRIDGE_RECIPES)
def test_recipe_rows_pass_bridge_validation(name, monkeypatch):
    from harness.run.backend_bridge import rejections

    recipe = load_recipe(name)
    monkeypatch.setenv("WORLD_SIZE", str(recipe.world_size))
    assert rejections(_as_worker_sees_it(name), list(recipe.rows)) == {}


def test_the_rejections_check_leaves_this_processs_environment_as_it_found_it(monkeypatch):
    # Bridge's runtime_config_update applies the recipe's environment defaults to os.environ
    # (apply_environment_variables); validated in the nightly's pytest process, they reached every row
    # the GPU tests launched after it (issue 36, defect 3).
    from harness.run.backend_bridge import HYBRID_EP_RANKS_ENV, rejections

    recipe = load_recipe("moonlight-short-8gpu")
    monkeypatch.setenv("WORLD_SIZE", str(recipe.world_size))
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS", HYBRID_EP_RANKS_ENV):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    assert rejections(_as_worker_sees_it(recipe.name), ["[]"]) == {}
    assert dict(os.environ) == before


@pytest.mark.parametrize("name", BRIDGE_RECIPES)
def test_every_rows_environment_is_what_its_rank_applies(name, tmp_path, monkeypatch):
    # The declared environment of each row (the launch's recorded variables, then the recipe's defaults
    # where unset) is what apply_recipe_environment leaves in a fresh rank and reports for the record.
    from harness.run.backend_bridge import apply_recipe_environment, configure, row_environment
    from harness.run.events import events_path, read_rank
    from harness.run.instrument import Instrument

    recipe = load_recipe(name)
    monkeypatch.setenv("WORLD_SIZE", str(recipe.world_size))
    launched = declared_environment(os.environ)
    for row in recipe.rows:
        cfg, _ = configure(_as_worker_sees_it(name), row)
        row_dir = tmp_path / row
        with preserved_environment():  # each row's rank starts from the launch's environment
            os.environ.update(launched)  # as torchrun starts the rank (its own default included)
            apply_recipe_environment(cfg, Instrument(row_dir, 0, "cpu"))
            applied = recorded_environment(os.environ)
        reported = read_rank(events_path(row_dir, 0), 0).environment
        assert applied == reported == row_environment(cfg, launched), row
        assert "PYTORCH_CUDA_ALLOC_CONF" in reported, row  # Bridge's recipes all set the allocator


@pytest.mark.parametrize(
    "name, dispatcher",
    [("nemotron-3-nano-short-1gpu", "alltoall"), ("nemotron-3-nano-short-8gpu", "flex/hybridep")],
)
def test_a_one_rank_expert_group_falls_back_even_where_hybridep_is_installed(
    name, dispatcher, monkeypatch
):
    # MCore's flex dispatcher dispatches over the TP x EP group and refuses a group of one at the first
    # dispatch: the shortened EP 1 recipe must fall back on an image that has HybridEP too (issue 36,
    # defect 2). HybridEP's flag is set as its import sets it on such an image; EP 8 keeps HybridEP.
    from megatron.core.transformer.moe import fused_a2a

    from harness.run.backend_bridge import configure, dispatcher_of

    monkeypatch.setattr(fused_a2a, "HAVE_HYBRIDEP", True)
    cfg, notes = configure(_as_worker_sees_it(name), "[]")
    assert dispatcher_of(cfg.model) == dispatcher
    if dispatcher == "alltoall":
        assert notes == {
            "moe_dispatcher_requested": "flex/hybridep (its expert-parallel group would be 1 rank: TP x EP = 1)"
        }
    else:
        assert notes == {}


@pytest.mark.parametrize("name", BRIDGE_RECIPES)
def test_short_run_sets_what_the_record_claims(name):
    from megatron.core.transformer.enums import AttnBackend

    from harness.run.backend_bridge import configure

    recipe, spec = load_recipe(name), _as_worker_sees_it(name)
    row = recipe.rows[-1]
    cfg, _ = configure(spec, row)
    model = cfg.model
    for field, value in {
        "recompute_modules": None,
        **RecomputeFields.parse(row).as_config_kwargs(),
    }.items():
        assert getattr(model, field) == value, field
    layout = recipe.parallelism
    assert (
        model.tensor_model_parallel_size,
        model.pipeline_model_parallel_size,
        model.context_parallel_size,
        model.expert_model_parallel_size,
    ) == (layout.tp, layout.pp, layout.cp, layout.ep)
    assert model.attention_backend == AttnBackend[recipe.attention_backend]
    assert (model.seq_length, cfg.dataset.seq_length) == (recipe.seq_length, recipe.seq_length)
    assert (cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size) == (
        recipe.train_iters,
        recipe.global_batch_size,
        recipe.micro_batch_size,
    )
    assert cfg.dataset.blend is None and cfg.dataset.blend_per_split is None  # mock data
    assert (cfg.checkpoint.save, cfg.checkpoint.load, cfg.checkpoint.pretrained_checkpoint) == (
        None,
        None,
        None,
    )
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer"
    if isinstance(model.moe_layer_freq, list):
        assert len(model.moe_layer_freq) == model.num_layers


@pytest.mark.parametrize("name", BRIDGE_RECIPES)
def test_steady_window_starts_after_cuda_graph_capture(name):
    from harness.run.backend_bridge import configure

    recipe = load_recipe(name)
    cfg, _ = configure(_as_worker_sees_it(name), "[]")
    if cfg.model.cuda_graph_impl in (None, "none"):
        pytest.skip(f"Bridge's recipe for {name} captures no CUDA graphs")
    # Bridge captures the graphs when `cuda_graph_warmup_steps` steps are done, i.e. in the next one.
    capture = cfg.model.cuda_graph_warmup_steps + 1
    assert recipe.steady_window[0] > capture, (
        f"steady window {recipe.steady_window} includes the capture step {capture}"
    )


def test_full_recompute_under_scoped_cuda_graphs_is_refused_before_launch():
    recipe = load_recipe("nemotron-3-nano-short-1gpu")
    with pytest.raises(
        UsageError,
        match="row 'full-uniform-1'.*full recompute is only supported with full iteration",
    ):
        check_bridge_rows(recipe, ["[]", "full-uniform-1"])


def test_rank_metrics_speaks_bridges_callback_api():
    from dataclasses import fields

    from megatron.bridge.training.callbacks import CallbackContext, CallbackManager
    from megatron.bridge.training.state import GlobalState, TrainState

    from harness.run.backend_bridge import RankMetrics

    manager = CallbackManager()
    for event in RankMetrics.EVENTS:
        manager.register(
            event, lambda context: None
        )  # Bridge raises ValueError on an event it does not know
    assert {"state", "loss_dict", "skipped_iter"} <= {
        field.name for field in fields(CallbackContext)
    }
    assert isinstance(GlobalState.train_state, property)
    assert {"step", "floating_point_operations_so_far"} <= {
        field.name for field in fields(TrainState)
    }


def test_failure_phases_name_frames_that_exist_in_bridge_and_megatron_core():
    import re
    from pathlib import Path

    import megatron.bridge
    import megatron.core

    from harness.run.backend_bridge import PHASE_FRAMES

    sources = [
        path
        for package in (megatron.bridge, megatron.core)
        for path in Path(package.__file__).parent.rglob("*.py")
    ]
    for fragment, function, phase in PHASE_FRAMES:
        defines = (
            re.compile(rf"^\s*def {re.escape(function)}\(", re.MULTILINE) if function else None
        )
        found = [
            path
            for path in sources
            if fragment in path.as_posix()
            and (
                defines is None
                or defines.search(path.read_text(encoding="utf-8", errors="replace"))
            )
        ]
        assert found, f"no source file matches ({fragment!r}, {function!r}) for phase {phase!r}"


def test_train_calls_pretrain_the_way_bridge_defines_it():
    # Read from source: importing `pretrain` needs nvidia-resiliency-ext, whose wheels for Bridge 0.6's
    # MCore (>= 0.6) need glibc 2.39, so ci/bridge-config-cpu.sh cannot install it on Debian 12.
    import ast
    from pathlib import Path

    import megatron.bridge
    from megatron.bridge.training.gpt_step import forward_step  # noqa: F401  (train passes it on)

    source = (
        Path(megatron.bridge.__file__)
        .parent.joinpath("training", "pretrain.py")
        .read_text(encoding="utf-8")
    )
    (pretrain,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "pretrain"
    ]
    parameters = [arg.arg for arg in pretrain.args.args + pretrain.args.kwonlyargs]
    # train() calls pretrain(cfg, forward_step, callbacks=...)
    assert parameters[:2] == ["config", "forward_step_func"] and "callbacks" in parameters


def test_collectives_wait_longer_than_the_runner_takes_to_call_a_stall():
    # Bridge's default (10 min) is shorter than the full recipes' stall timeout (15 min): NCCL's watchdog
    # would kill the ranks first, with no error line (issue 14, finding 5).
    from harness.run.backend_bridge import configure

    for name in BRIDGE_RECIPES:
        recipe = load_recipe(name)
        cfg, _ = configure(_as_worker_sees_it(name), "[]")
        assert (
            cfg.dist.distributed_timeout_minutes * 60 > recipe.timeout_s > recipe.stall_timeout_s
        ), name
        assert cfg.dist.distributed_timeout_seconds_after_init is None


def test_the_error_line_hooks_the_functions_pretrain_cleans_up_after():
    # _pretrain calls setup() and train() inside `try`, and its `except` aborts the process groups before
    # re-raising: the back end reports as the exception leaves those two functions (finding 12).
    import ast
    import inspect
    from pathlib import Path

    import megatron.bridge

    from harness.run.backend_bridge import _upstream_entry_points

    source = (
        Path(megatron.bridge.__file__)
        .parent.joinpath("training", "pretrain.py")
        .read_text(encoding="utf-8")
    )
    tree = ast.parse(source)
    (function,) = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "_pretrain"
    ]
    # The outermost try: the one whose body runs setup and train and whose handler cleans up.
    guarded = next(node for node in function.body if isinstance(node, ast.Try))
    called = {
        node.func.id
        for stmt in guarded.body
        for node in ast.walk(stmt)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    cleaned = {
        node.func.id
        for handler in guarded.handlers
        for node in ast.walk(handler)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "_cleanup_after_pretrain_failure" in cleaned
    imported = {
        alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    hooked = {fn.__name__: inspect.unwrap(fn).__module__ for fn in _upstream_entry_points()}
    assert hooked == {"setup": imported["setup"], "train": imported["train"]}
    assert {"setup", "train"} <= called


def test_the_fault_forward_step_gets_bridges_state_injected():
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.utils.train_utils import needs_global_state_injection

    from harness.run.backend_bridge import MarkedForwardStep

    assert needs_global_state_injection(forward_step)
    assert needs_global_state_injection(MarkedForwardStep(forward_step, None))


def test_a_flex_dispatcher_row_is_validated_on_the_workers_gpu():
    # Bridge's validate_flex_dispatcher_backend reads torch.cuda.get_device_properties(0) (finding 1).
    require(gpus=1, te=True, bridge=True)
    from megatron.core.transformer.moe import fused_a2a

    if not fused_a2a.HAVE_HYBRIDEP:
        pytest.skip("HybridEP is not installed: the rows fall back to alltoall")
    # EP 8 keeps HybridEP (an EP 1 recipe falls back to alltoall, which Bridge does not check).
    check_bridge_rows(load_recipe("nemotron-3-nano-short-8gpu"), ["[]"])
