"""The ``bridge`` back end: real Megatron Bridge recipes, shortened, with per-rank metrics of our own.

GPU tier only (Bridge needs Transformer Engine built against CUDA); the runner refuses a bridge
recipe before launch when ``megatron.bridge`` is not installed, and every Bridge import below is
made inside the functions that run on the GPU, so this module imports without Bridge. Recipes (the
Bridge API as read at the studied commit 600d069b; the files used are unchanged on the r0.6.0
release branch):

- ``nemotron_3_nano``: ``megatron.bridge.recipes.nemotronh.nemotron_3_nano.nemotron_3_nano_pretrain_config``
  with its HuggingFace tokenizer replaced by ``NullTokenizer`` + the explicit vocabulary size (no hub).
- ``moonlight_16b``: ``moonlight_16b_pretrain_8gpu_h100_bf16_config`` built offline: the recipe's model
  provider function (``AutoBridge.from_hf_pretrained`` on the hub) is swapped, for the duration of
  the call only, for ``AutoBridge.from_hf_config`` on a DeepSeek-V3 config carrying Moonlight's
  values (``harness/data/bridge/moonlight-16b-a3b.json``). (Bridge's own recipe tests keep the build
  offline by replacing the module's ``AutoBridge`` with a fake instead.)

Short-run overrides: iterations, warmup/decay, GBS/MBS, model and dataset sequence length, mock
data, evaluation off, log every step, checkpoint save/load off (the recipe's default checkpoint
directory would otherwise be resumed silently), the row's recompute fields, the parallel layout of
the harness recipe, and the MoE dispatcher falling back to ``alltoall`` when the flex back end's
package (DeepEP / HybridEP / TE's NCCL EP) is missing — recorded as a note in the run record.

Environment: Bridge's recipes carry environment defaults (the allocator's expandable segments, CUDA
connection counts) that its ``pretrain`` applies before CUDA starts; they are applied here at the same
point, before anything touches CUDA, and the record notes their values.

Before launch (``harness.run.preflight``): ``rejections`` runs Bridge's own pre-training update and
validation on every row's config, on the host, so a row Bridge refuses never reaches the GPUs.

Metrics: Bridge's own memory log covers data-parallel rank 0 and the first iterations only, so a
callback of ours reports every rank's allocator peaks after every step, the step time, the loss and
TFLOP/s. Phases: ``model-build`` until training starts, then ``forward`` when a step starts; when a
step fails, the phase is refined from the traceback (outermost Megatron frame: forward_step,
backward_step, finalize_model_grads, the optimizer).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
import traceback
from collections.abc import Iterator
from importlib import resources
from typing import Any

import torch
from megatron.core.transformer.enums import AttnBackend

from harness.run.instrument import Instrument
from harness.config.fields import RecomputeFields
from harness.run.recipes import Recipe

# (path fragment, function name) of the outermost frame that places a failure in a phase.
PHASE_FRAMES: tuple[tuple[str, str, str], ...] = (
    ("training/setup.py", "", "model-build"),
    ("", "get_model", "model-build"),
    ("", "finalize_model_grads", "grad-sync"),
    ("megatron/core/optimizer", "step", "optimizer-step"),
    ("pipeline_parallel/schedules.py", "backward_step", "backward"),
    ("pipeline_parallel/schedules.py", "forward_step", "forward"),
)


def phase_from_traceback(exc: BaseException, iteration: int) -> str | None:
    for frame in traceback.extract_tb(exc.__traceback__):
        for fragment, function, phase in PHASE_FRAMES:
            if fragment in frame.filename.replace("\\", "/") and (not function or frame.name == function):
                return "optimizer-init" if phase == "optimizer-step" and iteration == 1 else phase
    return None


class RankMetrics:
    """Every rank, every step: phase marks, step time, loss, allocator peaks, TFLOP/s.

    A plain class so that this module imports without Bridge: ``train`` registers its ``on_*`` methods
    with Bridge's ``CallbackManager.register`` (the functional form of Bridge's callback API).
    """

    EVENTS = ("on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end")

    def __init__(self, instrument: Instrument, world_size: int) -> None:
        self.instrument = instrument
        self.world_size = world_size
        self.step_started = 0.0
        self.flops_before = 0.0
        self.pending: dict[str, Any] | None = None

    def _flops(self, context: Any) -> float | None:
        value = getattr(context.state.train_state, "floating_point_operations_so_far", None)
        return None if value is None else float(value)

    def _flush(self, context: Any) -> None:
        """Emit the previous step: Bridge adds a step's FLOPs to the running total after on_train_step_end."""
        if self.pending is None:
            return
        flops = self._flops(context)
        tflops = None
        if flops is not None and self.pending["step_time_ms"]:
            tflops = (flops - self.flops_before) / (self.pending["step_time_ms"] / 1000.0) / self.world_size / 1e12
            self.flops_before = flops
        self.instrument.iteration_end(
            self.pending["iteration"], loss=self.pending["loss"], step_time_ms=self.pending["step_time_ms"],
            skipped=self.pending["skipped"], tflops_per_gpu=tflops, peaks=self.pending["peaks"],
        )
        self.pending = None

    def on_train_start(self, context: Any) -> None:
        self.instrument.device_ready()
        self.flops_before = self._flops(context) or 0.0

    def on_train_step_start(self, context: Any) -> None:
        self._flush(context)
        self.instrument.enter(context.state.train_state.step + 1, "forward")
        self.step_started = time.perf_counter()

    def on_train_step_end(self, context: Any) -> None:
        torch.cuda.synchronize()
        step_time_ms = (time.perf_counter() - self.step_started) * 1000.0
        losses = list((context.loss_dict or {}).values())
        loss = float(losses[0]) if losses else None  # only the last pipeline stage holds the loss
        # Bridge's train_step zeroes gradients at the start of the next step (DDP grad buffers persist),
        # so "after the step" is the only between-iterations point this callback sees.
        self.instrument.read_allocated("after_step")
        self.pending = {
            "iteration": context.state.train_state.step + 1, "loss": loss, "step_time_ms": step_time_ms,
            "skipped": bool(context.skipped_iter), "peaks": self.instrument.memory_peaks(),
        }

    def on_train_end(self, context: Any) -> None:
        self._flush(context)


@contextlib.contextmanager
def _swapped(module: Any, name: str, replacement: Any) -> Iterator[None]:
    if not hasattr(module, name):
        raise RuntimeError(f"{module.__name__}.{name} not found: the installed Bridge changed its Moonlight recipe")
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def moonlight_16b_config(options: dict[str, Any]) -> Any:
    from transformers import DeepseekV3Config

    from megatron.bridge import AutoBridge
    from megatron.bridge.recipes.moonlight.h100 import moonlight_16b as recipe_module

    text = resources.files("harness").joinpath("data", "bridge", "moonlight-16b-a3b.json").read_text(encoding="utf-8")
    values = {key: value for key, value in json.loads(text).items() if not key.startswith("_")}

    def offline_provider() -> Any:
        return AutoBridge.from_hf_config(DeepseekV3Config(**values)).to_megatron_provider(load_weights=False)

    with _swapped(recipe_module, "_moonlight_16b_model_provider", offline_provider):
        return recipe_module.moonlight_16b_pretrain_8gpu_h100_bf16_config()


def nemotron_3_nano_config(options: dict[str, Any]) -> Any:
    from megatron.bridge.recipes.nemotronh.nemotron_3_nano import nemotron_3_nano_pretrain_config

    cfg = nemotron_3_nano_pretrain_config()
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.tokenizer_model = None
    cfg.tokenizer.vocab_size = int(options["vocab_size"])
    return cfg


RECIPES = {"moonlight_16b": moonlight_16b_config, "nemotron_3_nano": nemotron_3_nano_config}  # = recipes.BRIDGE_RECIPES


def _dispatcher_fallback(cfg: Any) -> str | None:
    """Fall back to ``alltoall`` when the flex dispatcher's back-end package is missing; the record's note."""
    from megatron.core.transformer.moe import fused_a2a

    if getattr(cfg.model, "moe_token_dispatcher_type", None) != "flex":
        return None
    backend = getattr(cfg.model, "moe_flex_dispatcher_backend", None)
    available = {"deepep": fused_a2a.HAVE_DEEP_EP, "hybridep": fused_a2a.HAVE_HYBRIDEP,
                 "ncclep": fused_a2a.HAVE_TE_EP}.get(backend, True)
    if available:
        return f"flex/{backend}"
    cfg.model.moe_token_dispatcher_type = "alltoall"
    cfg.model.moe_flex_dispatcher_backend = None
    return f"alltoall (flex/{backend} unavailable on this machine)"


def short_run(cfg: Any, recipe: Recipe, row: str) -> tuple[Any, dict[str, str]]:
    """The harness recipe's overrides on Bridge's recipe (see the module docstring), and notes for the record."""
    layout = recipe.parallelism
    iters = recipe.train_iters
    cfg.train.train_iters = iters
    cfg.train.global_batch_size = recipe.global_batch_size
    cfg.train.micro_batch_size = recipe.micro_batch_size
    cfg.scheduler.lr_warmup_iters = max(1, iters // 10)
    cfg.scheduler.lr_decay_iters = iters
    cfg.model.seq_length = recipe.seq_length
    cfg.dataset.seq_length = recipe.seq_length
    cfg.dataset.blend = None  # mock data
    cfg.dataset.blend_per_split = None
    cfg.validation.eval_iters = 0
    cfg.validation.eval_interval = None
    cfg.logger.log_interval = 1
    cfg.logger.tensorboard_dir = None
    cfg.logger.wandb_project = None
    cfg.checkpoint.save = None
    cfg.checkpoint.load = None
    cfg.checkpoint.save_interval = None
    cfg.checkpoint.pretrained_checkpoint = None
    cfg.model.tensor_model_parallel_size = layout.tp
    cfg.model.pipeline_model_parallel_size = layout.pp
    cfg.model.context_parallel_size = layout.cp
    cfg.model.expert_model_parallel_size = layout.ep
    cfg.model.expert_tensor_parallel_size = layout.expert_tp
    cfg.model.virtual_pipeline_model_parallel_size = layout.vpp
    if layout.tp == 1:
        cfg.model.sequence_parallel = False
    # The record names the attention backend, so the run must use it (Bridge's recipes may leave auto).
    cfg.model.attention_backend = AttnBackend[recipe.attention_backend]
    for name, value in recipe.backend_options.get("model", {}).items():
        if not hasattr(cfg.model, name):
            raise ValueError(f"Bridge's model provider has no field {name!r} (recipe [bridge.model])")
        setattr(cfg.model, name, value)
    if isinstance(cfg.model.moe_layer_freq, list):
        # Bridge's DeepSeek-V3 provider spells the dense/MoE pattern as one entry per layer of the full
        # model (first_k_dense_replace zeros, then ones) and MCore requires len == num_layers: a
        # shortened model keeps the pattern's first layers.
        cfg.model.moe_layer_freq = cfg.model.moe_layer_freq[: cfg.model.num_layers]
    recompute = {"recompute_modules": None, **RecomputeFields.parse(row).as_config_kwargs()}  # full rows: no module list
    for name, value in recompute.items():
        setattr(cfg.model, name, value)
    dispatcher = _dispatcher_fallback(cfg)
    return cfg, {} if dispatcher is None else {"moe_dispatcher": dispatcher}


def _bridge_recipe(recipe: Recipe) -> Any:
    """Bridge's own recipe config, before the harness's overrides."""
    options = recipe.backend_options
    return RECIPES[options["recipe"]](options)


def configure(recipe: Recipe, row: str) -> tuple[Any, dict[str, str]]:
    """Bridge's config for this harness recipe and row, and notes for the record."""
    return short_run(_bridge_recipe(recipe), recipe, row)


def rejections(recipe: Recipe, rows: list[str]) -> dict[str, str]:
    """The rows whose config Bridge's own pre-training update and validation (``runtime_config_update``,
    the first thing ``pretrain`` does) refuses, with the reason. Needs no GPU; Bridge's recipe is built once."""
    from megatron.bridge.training.config import runtime_config_update

    base = _bridge_recipe(recipe)
    refused = {}
    for row in rows:
        cfg, _ = short_run(copy.deepcopy(base), recipe, row)
        try:
            runtime_config_update(cfg)
        except Exception as exc:  # MCore's rules are asserts and ValueErrors; Bridge adds its own types
            refused[row] = f"{type(exc).__name__}: {exc}"
    return refused


def apply_recipe_environment(cfg: Any, instrument: Instrument) -> None:
    """Bridge's recipes carry environment defaults (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
    ``CUDA_DEVICE_MAX_CONNECTIONS``) that ``pretrain`` applies before CUDA starts in Bridge's own launches;
    CUDA and its caching allocator read them once, at initialisation, so they are applied here before
    anything touches CUDA. A value already set by the launcher wins, as in Bridge. The record notes the
    values the run had, and whether CUDA had started before (then the allocator ignored them)."""
    from megatron.bridge.training.config import apply_environment_variables

    late = torch.cuda.is_initialized()
    apply_environment_variables(cfg)
    for name in sorted(cfg.env_vars):
        instrument.note(f"env.{name}", os.environ[name])
    if late:
        instrument.note("env_applied_after_cuda_init", "true: the allocator did not see these values")


def train(recipe: Recipe, row: str, instrument: Instrument) -> None:
    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    world = recipe.world_size
    with instrument.phase(0, "model-build"):
        cfg, notes = configure(recipe, row)
    for key, value in notes.items():
        instrument.note(key, value)
    apply_recipe_environment(cfg, instrument)
    metrics, callbacks = RankMetrics(instrument, world), CallbackManager()
    for event in RankMetrics.EVENTS:
        callbacks.register(event, getattr(metrics, event))
    try:
        pretrain(cfg, forward_step, callbacks=callbacks)
    except BaseException as exc:
        instrument.phase_name = phase_from_traceback(exc, instrument.iteration) or instrument.phase_name
        raise
