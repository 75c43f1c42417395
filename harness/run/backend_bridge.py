"""The ``bridge`` back end: real Megatron Bridge recipes, shortened, with per-rank metrics of our own.

GPU tier only (Bridge needs Transformer Engine built against CUDA); the runner refuses a bridge
recipe before launch when ``megatron.bridge`` is not installed, and every Bridge import below is
made inside the functions that run on the GPU, so this module imports without Bridge. Recipes (the
Bridge API as read at the studied commit 600d069b; the files used are unchanged on the r0.6.0
release branch):

- ``nemotron_3_nano``: ``megatron.bridge.recipes.nemotronh.nemotron_3_nano.nemotron_3_nano_pretrain_config``
  with its HuggingFace tokenizer replaced by ``NullTokenizer`` + the explicit vocabulary size (no hub).
- ``llama3_70b_sft_fp8cs``: ``megatron.bridge.perf_recipes.llama.h100.llama3.llama3_70b_sft_32gpu_h100_fp8cs_config``
  (the card's Llama3 70B SFT study) built offline the same way: the gated hub config its SFT recipe
  reads is answered by ``AutoBridge.from_hf_config`` on ``harness/data/bridge/llama3-70b.json``.
- ``moonlight_16b``: ``moonlight_16b_pretrain_8gpu_h100_bf16_config`` built offline: the recipe's model
  provider function (``AutoBridge.from_hf_pretrained`` on the hub) is swapped, for the duration of
  the call only, for ``AutoBridge.from_hf_config`` on a DeepSeek-V3 config carrying Moonlight's
  values (``harness/data/bridge/moonlight-16b-a3b.json``). (Bridge's own recipe tests keep the build
  offline by replacing the module's ``AutoBridge`` with a fake instead.)

Short-run overrides: iterations, warmup/decay, GBS/MBS, model and dataset sequence length, mock
data, evaluation off, Bridge's own log (and its barrier) past the last step (``log_interval``), checkpoint save/load off (the recipe's default checkpoint
directory would otherwise be resumed silently), the row's recompute fields, the parallel layout of
the harness recipe, and the MoE dispatcher falling back to ``alltoall`` when the flex back end
(DeepEP / HybridEP / TE's NCCL EP) cannot run the row: its package is missing, or the row's TP x EP
group is one rank (``flex_backend_unusable``) — recorded as a note in the run record.

Environment: Bridge's recipes carry environment defaults (the allocator's expandable segments, CUDA
connection counts) that its ``pretrain`` applies before CUDA starts; they are applied here at the same
point, before anything touches CUDA (HybridEP's ranks per NVLink domain fitted to the row's EP size,
``hybrid_ep_environment``), the record notes their values and keeps every variable that changes
allocator, dispatcher, kernels or graphs (``harness.run.environment``), and the allocator's own settings
are read back (``harness.run.allocator``): the record says when it had already fixed other ones.
``rejections`` validates in the caller's process and leaves its ``os.environ`` as it found it.

Collective timeout: Bridge's default is 10 minutes (``dist.distributed_timeout_minutes``), and
torch's NCCL watchdog then kills the rank without a Python error; the row's timeout is used instead
(as in the mcore back end), so a hang is the runner's stall call, classified with its stage.

Before launch (``harness.run.preflight``): ``rejections`` runs Bridge's own pre-training update and
validation on every row's config, on the host, so a row Bridge refuses never reaches the GPUs.

Metrics: Bridge's own memory log covers data-parallel rank 0 and the first iterations only, so a
callback of ours reports every rank's allocator peaks and device memory in use at every step's end,
and the step time as Bridge's log defines it: the whole loop from one step's end to the next
(``train_step`` plus the loop's own work: ``training_log`` (its barrier kept out of the run: ``log_interval``), the manual
``gc.collect`` every ``manual_gc_interval`` steps, CUDA-graph capture), device synchronised. Bridge
adds a step's FLOPs to its running total after ``on_train_step_end``, so they are reported at the
next step's start (``flops`` event); the record divides them by the same step time. The attention
back end and MoE dispatcher the run actually has (after Bridge's set-up) are noted at training start.

Phases: ``model-build`` until training starts; ``cuda-graph-capture`` from the end of the step after
which Bridge captures TE CUDA graphs (``cuda_graph_warmup_steps``) to the next step's start;
``forward`` when a step (and each micro-batch's forward) starts; ``backward`` when autograd reaches the
model's output; ``grad-sync`` and ``optimizer-step`` when MCore's ``finalize_model_grads`` and the
optimizer's ``step`` are called (``marking``). When a step fails, the phase is refined from the traceback (outermost
Megatron frame: forward_step, backward_step, finalize_model_grads, the optimizer), and the error line
is written as the exception leaves Bridge's ``setup``/``train``, before ``_pretrain``'s clean-up
(``destroy_global_state``, aborting the process groups), which may hang. Faults: those phases, and a
NaN/Inf loss through the forward-step function's loss function (Bridge's own loss checks then fire).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
import time
import traceback
from collections.abc import Iterator
from importlib import resources
from typing import Any

import torch
from megatron.core.transformer.enums import AttnBackend
from megatron.core.utils import get_model_config

from harness.config.fields import RecomputeFields
from harness.run.allocator import ignored_allocator_env
from harness.run.environment import preserved_environment, recorded_environment
from harness.run.instrument import Instrument
from harness.run.recipes import Recipe, bridge_builders

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
            if fragment in frame.filename.replace("\\", "/") and (
                not function or frame.name == function
            ):
                return "optimizer-init" if phase == "optimizer-step" and iteration == 1 else phase
    return None


def dispatcher_of(model: Any) -> str | None:
    """The MoE token dispatcher a model config runs with: ``alltoall``, ``flex/hybridep``...; None without MoE."""
    if not getattr(model, "num_moe_experts", None):
        return None
    kind = getattr(model, "moe_token_dispatcher_type", None)
    backend = getattr(model, "moe_flex_dispatcher_backend", None)
    return f"{kind}/{backend}" if kind == "flex" and backend else str(kind)


def capture_after(model: Any, start_iteration: int) -> int | None:
    """The iteration after which Bridge's loop captures TE CUDA graphs (train.py: when
    ``step - start_iteration == cuda_graph_warmup_steps``, before the next step); None if it never does."""
    if getattr(model, "cuda_graph_impl", None) != "transformer_engine":
        return None
    return start_iteration + int(model.cuda_graph_warmup_steps)


def _synchronize() -> None:
    """Wait for the device before reading the clock; nothing to wait for before CUDA has started."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def marking(
    function: Any, instrument: Instrument, phase: str, on_first_iteration: str | None = None
) -> Any:
    """``function`` that first marks ``phase`` of the current iteration (where an injected fault fires).
    Bridge's callbacks fire only at a step's start and end, so the phases inside a step are marked by
    wrapping what Bridge's ``train_step`` calls: the model config's ``finalize_model_grads_func``
    (grad-sync, called by MCore's schedules after the last backward) and ``optimizer.step``, whose
    first call allocates the optimizer's state (``optimizer-init``, as the mcore back end names it)."""

    @functools.wraps(function)
    def marked(*args: Any, **kwargs: Any) -> Any:
        first = on_first_iteration if instrument.iteration == 1 else None
        instrument.enter(instrument.iteration, phase if first is None else first)
        return function(*args, **kwargs)

    return marked


def mark_backward(output_tensor: Any, instrument: Instrument, iteration: int) -> None:
    """Mark ``backward`` when autograd reaches the model's output, the first thing a micro-batch's backward
    computes after the loss (the last pipeline stage: earlier stages are placed by grad-sync)."""
    if isinstance(output_tensor, torch.Tensor) and output_tensor.requires_grad:

        def started(grad: torch.Tensor) -> None:
            instrument.enter(iteration, "backward")

        output_tensor.register_hook(started)


class RankMetrics:
    """Every rank, every step: phase marks, step time, loss, allocator peaks, device memory, FLOPs.

    A plain class so that this module imports without Bridge: ``train`` registers its ``on_*`` methods
    with Bridge's ``CallbackManager.register`` (the functional form of Bridge's callback API).
    """

    EVENTS = ("on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end")

    def __init__(self, instrument: Instrument) -> None:
        self.instrument = instrument
        self.interval_started = 0.0
        self.flops_before = 0.0
        self.flops_pending: int | None = (
            None  # the step whose FLOPs Bridge adds after on_train_step_end
        )
        self.capture_after: int | None = None

    def _flops(self, context: Any) -> float | None:
        value = getattr(context.state.train_state, "floating_point_operations_so_far", None)
        return None if value is None else float(value)

    def _report_flops(self, context: Any) -> None:
        flops = self._flops(context)
        if self.flops_pending is not None and flops is not None:
            self.instrument.flops(self.flops_pending, flops - self.flops_before)
        self.flops_before = flops or 0.0
        self.flops_pending = None

    def on_train_start(self, context: Any) -> None:
        self.instrument.device_ready()
        model = context.state.cfg.model  # after Bridge's set-up: what the run really has
        self.instrument.note(
            "attention_backend",
            getattr(model.attention_backend, "name", str(model.attention_backend)),
        )
        dispatcher = dispatcher_of(model)
        if dispatcher is not None:
            self.instrument.note("moe_dispatcher", dispatcher)
        config = get_model_config(context.model[0])
        if config.finalize_model_grads_func is not None:
            config.finalize_model_grads_func = marking(
                config.finalize_model_grads_func, self.instrument, "grad-sync"
            )
        context.optimizer.step = marking(
            context.optimizer.step, self.instrument, "optimizer-step", "optimizer-init"
        )
        start = context.state.train_state.step
        self.capture_after = capture_after(model, start)
        self.flops_before = self._flops(context) or 0.0
        if self.capture_after == start:  # no warm-up steps: Bridge captures before the first step
            self.instrument.enter(start + 1, "cuda-graph-capture")
        _synchronize()
        self.interval_started = time.perf_counter()

    def on_train_step_start(self, context: Any) -> None:
        self._report_flops(context)
        self.instrument.enter(context.state.train_state.step + 1, "forward")

    def on_train_step_end(self, context: Any) -> None:
        _synchronize()
        now = time.perf_counter()
        iteration = context.state.train_state.step + 1
        losses = list((context.loss_dict or {}).values())
        loss = float(losses[0]) if losses else None  # only the last pipeline stage holds the loss
        # Bridge's train_step zeroes gradients at the start of the next step (DDP grad buffers persist),
        # so "after the step" is the only between-iterations point this callback sees.
        self.instrument.read_allocated("after_step")
        # Emitted now, not at the next step's start: a failure in between (CUDA-graph capture) keeps it.
        self.instrument.iteration_end(
            iteration,
            loss=loss,
            step_time_ms=(now - self.interval_started) * 1000.0,
            skipped=bool(context.skipped_iter),
            peaks=self.instrument.memory_peaks(),
        )
        self.interval_started = now
        self.flops_pending = iteration
        if iteration == self.capture_after:
            self.instrument.enter(iteration + 1, "cuda-graph-capture")

    def on_train_end(self, context: Any) -> None:
        self._report_flops(context)


class MarkedForwardStep:
    """Bridge's forward-step function with phase marks and the fault hook on its loss: each micro-batch's
    forward is marked ``forward`` (a micro-batch's forward follows the previous one's backward), its
    backward is marked when autograd reaches the output (``mark_backward``), and the loss function
    receives the model's per-token output poisoned (NaN/Inf) on the fault's rank and iteration, so
    Bridge's own loss checks see it. Bridge injects its ``GlobalState`` because the first parameter is
    ``state``."""

    def __init__(self, forward_step: Any, instrument: Instrument) -> None:
        self.forward_step = forward_step
        self.instrument = instrument

    def __call__(
        self, state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False
    ) -> Any:
        iteration = state.train_state.step + 1
        self.instrument.enter(iteration, "forward")
        output, loss_function = self.forward_step(state, data_iterator, model, return_schedule_plan)

        def poisoned(output_tensor: Any, *args: Any, **kwargs: Any) -> Any:
            mark_backward(output_tensor, self.instrument, iteration)
            return loss_function(self.instrument.loss(output_tensor, iteration), *args, **kwargs)

        return output, poisoned


@contextlib.contextmanager
def _swapped(module: Any, name: str, replacement: Any) -> Iterator[None]:
    if not hasattr(module, name):
        raise RuntimeError(
            f"{module.__name__}.{name} not found: the installed Bridge changed the recipe it builds"
        )
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def moonlight_16b_config(options: dict[str, Any]) -> Any:
    from megatron.bridge import AutoBridge
    from megatron.bridge.recipes.moonlight.h100 import moonlight_16b as recipe_module
    from transformers import DeepseekV3Config

    text = (
        resources.files("harness")
        .joinpath("data", "bridge", "moonlight-16b-a3b.json")
        .read_text(encoding="utf-8")
    )
    values = {key: value for key, value in json.loads(text).items() if not key.startswith("_")}

    def offline_provider() -> Any:
        return AutoBridge.from_hf_config(DeepseekV3Config(**values)).to_megatron_provider(
            load_weights=False
        )

    with _swapped(recipe_module, "_moonlight_16b_model_provider", offline_provider):
        return recipe_module.moonlight_16b_pretrain_8gpu_h100_bf16_config()


def nemotron_3_nano_config(options: dict[str, Any]) -> Any:
    from megatron.bridge.recipes.nemotronh.nemotron_3_nano import nemotron_3_nano_pretrain_config

    cfg = nemotron_3_nano_pretrain_config()
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.tokenizer_model = None
    cfg.tokenizer.vocab_size = int(options["vocab_size"])
    return cfg


def llama3_70b_sft_fp8cs_config(options: dict[str, Any]) -> Any:
    """Bridge's ``llama3_70b_sft_32gpu_h100_fp8cs_config`` built offline: the SFT recipe it starts
    from reads the gated hub config (``AutoBridge.from_hf_pretrained``); for the duration of the call
    that module's ``AutoBridge`` answers it with ``from_hf_config`` on the same values
    (``harness/data/bridge/llama3-70b.json``)."""
    from megatron.bridge import AutoBridge
    from megatron.bridge.perf_recipes.llama.h100.llama3 import (
        llama3_70b_sft_32gpu_h100_fp8cs_config,
    )
    from megatron.bridge.recipes.llama.h100 import llama3 as sft_module
    from transformers import LlamaConfig

    text = (
        resources.files("harness")
        .joinpath("data", "bridge", "llama3-70b.json")
        .read_text(encoding="utf-8")
    )
    values = {key: value for key, value in json.loads(text).items() if not key.startswith("_")}

    class OfflineAutoBridge(AutoBridge):
        @classmethod
        def from_hf_pretrained(cls, path: Any, **kwargs: Any) -> Any:
            return AutoBridge.from_hf_config(LlamaConfig(**values))

    with _swapped(sft_module, "AutoBridge", OfflineAutoBridge):
        return llama3_70b_sft_32gpu_h100_fp8cs_config()


RECIPES = {
    "moonlight_16b": moonlight_16b_config,
    "nemotron_3_nano": nemotron_3_nano_config,
    "llama3_70b_sft_fp8cs": llama3_70b_sft_fp8cs_config,
}  # = recipes.BRIDGE_RECIPES


# The flex dispatcher's back ends, by the flag MCore's fused_a2a sets when the back end's package imports.
FLEX_BACKEND_FLAGS = {"deepep": "HAVE_DEEP_EP", "hybridep": "HAVE_HYBRIDEP", "ncclep": "HAVE_TE_EP"}


def flex_backend_unusable(backend: str, tp: int, ep: int, installed: bool) -> str | None:
    """Why the flex dispatcher with ``backend`` cannot run a TP x EP layout, or None when it can.

    Every flex back end dispatches over MCore's TP x EP group, and a group of one rank is refused at
    the first dispatch (MCore's MoEFlexTokenDispatcher: "DeepEP dispatcher requires TPxEP > 1", the
    same for NCCL EP; HybridEP's buffer asserts its group size too), whether or not the package is
    installed: a shortened EP 1 recipe needs the fallback even on an image that has HybridEP."""
    if tp * ep == 1:
        return f"flex/{backend} (its expert-parallel group would be 1 rank: TP x EP = 1)"
    if not installed:
        return f"flex/{backend} (its package is missing on this machine)"
    return None


def _dispatcher_fallback(cfg: Any) -> str | None:
    """Fall back to ``alltoall`` when the flex dispatcher's back end cannot run the row's layout here
    (``flex_backend_unusable``); the request, for the record (the dispatcher the run has is noted at
    training start, ``RankMetrics``)."""
    from megatron.core.transformer.moe import fused_a2a

    if getattr(cfg.model, "moe_token_dispatcher_type", None) != "flex":
        return None
    backend = getattr(cfg.model, "moe_flex_dispatcher_backend", None)
    if backend not in FLEX_BACKEND_FLAGS:  # another back end, or none named: nothing to check
        return None
    reason = flex_backend_unusable(
        backend,
        cfg.model.tensor_model_parallel_size,
        cfg.model.expert_model_parallel_size,
        bool(getattr(fused_a2a, FLEX_BACKEND_FLAGS[backend], False)),
    )
    if reason is None:
        return None
    cfg.model.moe_token_dispatcher_type = "alltoall"
    cfg.model.moe_flex_dispatcher_backend = None
    return reason


# HybridEP (DeepEP's hybrid_ep buffer, through MCore's flex dispatcher) reads how many EP ranks share one
# NVLink domain from this variable and asserts that the EP group's size is a multiple of it ("The number
# of ranks {group.size()} should be divisible by the number of ranks per NVLink domain {n}.", MCore's
# fused_a2a._hybrid_ep_num_nodes, main after 0.19). Bridge's Nemotron 3 Nano / Moonlight recipes set 8,
# right for their EP 8 layouts and fatal at the first dispatch of a shortened EP 1 or EP 2 one.
HYBRID_EP_RANKS_ENV = "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"


def hybrid_ep_environment(env_vars: dict[str, Any], ep: int) -> dict[str, Any]:
    """The recipe's environment with HybridEP's ranks per NVLink domain fitted to the row's EP size: kept
    when EP is a multiple of it (EP 16 over two 8-GPU nodes: 8 per domain), EP itself when the whole EP
    group fits in one domain (EP 1, 2, 4 under a recipe's 8); any other layout is refused (ValueError,
    which Bridge's pre-launch check reports for the row in one line)."""
    if HYBRID_EP_RANKS_ENV not in env_vars:
        return dict(env_vars)
    per_domain = int(env_vars[HYBRID_EP_RANKS_ENV])
    if per_domain >= 1 and ep % per_domain == 0:
        return dict(env_vars)
    if per_domain >= 1 and per_domain % ep == 0:
        return {**env_vars, HYBRID_EP_RANKS_ENV: ep}
    raise ValueError(
        f"expert_model_parallel_size {ep} does not fit HybridEP's {HYBRID_EP_RANKS_ENV}="
        f"{per_domain} (Bridge's recipe): EP must be a multiple of it, or divide it"
    )


def log_interval(recipe: Recipe) -> int:
    """Bridge's ``logger.log_interval`` for a short run: past the last iteration. Bridge's ``training_log``
    reads its interval timer with a barrier (``timers("interval-time").elapsed(barrier=True)``) at every
    step where ``iteration % log_interval == 0`` (``training/utils/train_utils.py`` at r0.6); logging every
    step put a world barrier inside every measured step, one the user's job (logging every 10 or 100
    steps) pays once per interval. So the barrier is kept out of the run, not measured and subtracted;
    the harness's own callback logs every step. The recipe's ``manual_gc_interval`` stays: its
    ``gc.collect`` is a cost the user's job pays at the same steps."""
    return recipe.train_iters + 1


def collective_timeout_minutes(recipe: Recipe) -> int:
    """Bridge's collective timeout for a row: at least the row's own timeout (which is longer than its
    stall timeout), so the runner's stall detection, not NCCL's watchdog, ends a hung row."""
    return max(1, math.ceil(max(recipe.timeout_s, recipe.stall_timeout_s) / 60.0) + 1)


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
    cfg.logger.log_interval = log_interval(recipe)
    cfg.logger.tensorboard_dir = None
    cfg.logger.wandb_project = None
    cfg.checkpoint.save = None
    cfg.checkpoint.load = None
    cfg.checkpoint.save_interval = None
    cfg.checkpoint.pretrained_checkpoint = None
    cfg.dist.distributed_timeout_minutes = collective_timeout_minutes(recipe)
    cfg.dist.distributed_timeout_seconds_after_init = None  # else Bridge shortens it after step 1
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
            raise ValueError(
                f"Bridge's model provider has no field {name!r} (recipe [bridge.model])"
            )
        setattr(cfg.model, name, value)
    if isinstance(cfg.model.moe_layer_freq, list):
        # Bridge's DeepSeek-V3 provider spells the dense/MoE pattern as one entry per layer of the full
        # model (first_k_dense_replace zeros, then ones) and MCore requires len == num_layers: a
        # shortened model keeps the pattern's first layers.
        cfg.model.moe_layer_freq = cfg.model.moe_layer_freq[: cfg.model.num_layers]
    recompute = {
        "recompute_modules": None,
        **RecomputeFields.parse(row).as_config_kwargs(),
    }  # full rows: no module list
    for name, value in recompute.items():
        setattr(cfg.model, name, value)
    cfg.env_vars = hybrid_ep_environment(cfg.env_vars, layout.ep)
    requested = _dispatcher_fallback(cfg)
    return cfg, {} if requested is None else {"moe_dispatcher_requested": requested}


def _bridge_recipe(recipe: Recipe) -> Any:
    """Bridge's own recipe config, before the harness's overrides."""
    options = recipe.backend_options
    name = options["recipe"]
    builder = (
        RECIPES.get(name) or bridge_builders()[name].load()
    )  # load_recipe refused any other name
    return builder(options)


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
        # runtime_config_update applies the recipe's environment defaults to os.environ: in a caller's
        # process they would reach every row it launches later, unrecorded.
        with preserved_environment():
            try:
                runtime_config_update(cfg)
            except (
                Exception  # noqa: BLE001
            ) as exc:  # MCore's rules are asserts and ValueErrors; Bridge adds its own types
                refused[row] = f"{type(exc).__name__}: {exc}"
    return refused


def row_environment(cfg: Any, launched: dict[str, str]) -> dict[str, str]:
    """The recorded variables a row runs with: those it was launched with (``launched``), then the
    recipe's defaults where the launch left one unset (Bridge's ``apply_environment_variables``: the
    launcher wins), as ``apply_recipe_environment`` leaves them."""
    defaults = {name: str(value) for name, value in cfg.env_vars.items()}
    return recorded_environment({**defaults, **launched})


def apply_recipe_environment(cfg: Any, instrument: Instrument) -> None:
    """Bridge's recipes carry environment defaults (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
    ``CUDA_DEVICE_MAX_CONNECTIONS``) that ``pretrain`` applies before CUDA starts in Bridge's own launches;
    the allocator reads its settings once and CUDA its connection count at initialisation, so they are
    applied here before anything touches CUDA. A value already set by the launcher wins, as in Bridge.
    The record notes the values the run had and, when the allocator had already fixed other settings
    (read before, even without CUDA starting), that its peaks are not the recipe's."""
    from megatron.bridge.training.config import apply_environment_variables

    late = torch.cuda.is_initialized()
    apply_environment_variables(cfg)
    applied = {name: os.environ[name] for name in sorted(cfg.env_vars)}
    for name, value in applied.items():
        instrument.note(f"env.{name}", value)
    instrument.environment(recorded_environment(os.environ))
    ignored = ignored_allocator_env(applied)
    if ignored is not None:
        instrument.note("allocator_ignored_env", ignored)
    if late:
        instrument.note(
            "env_applied_after_cuda_init", "true: CUDA had started before these values were set"
        )


def _upstream_entry_points() -> list[Any]:
    """Bridge's functions whose exceptions ``_pretrain`` catches and cleans up after before re-raising."""
    from megatron.bridge.training.setup import setup
    from megatron.bridge.training.train import train as bridge_train

    return [setup, bridge_train]


def train(recipe: Recipe, row: str, instrument: Instrument) -> None:
    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    with instrument.phase(0, "model-build"):
        cfg, notes = configure(recipe, row)
    for key, value in notes.items():
        instrument.note(key, value)
    apply_recipe_environment(cfg, instrument)
    metrics, callbacks = RankMetrics(instrument), CallbackManager()
    for event in RankMetrics.EVENTS:
        callbacks.register(event, getattr(metrics, event))

    def refine_phase(exc: BaseException) -> None:
        instrument.phase_name = (
            phase_from_traceback(exc, instrument.iteration) or instrument.phase_name
        )

    step = MarkedForwardStep(forward_step, instrument)
    try:
        with instrument.reporting_unwind(_upstream_entry_points(), before_report=refine_phase):
            pretrain(cfg, step, callbacks=callbacks)
    except BaseException as exc:
        refine_phase(exc)
        raise
