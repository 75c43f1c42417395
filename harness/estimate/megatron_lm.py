"""A Megatron-LM argument list (``pretrain_gpt.py`` / ``pretrain_mamba.py``, as Megatron-LM
d98e8a64 takes it) as the estimate and ``plan`` see it: the model, its layout, batch and precision,
the settings that size gradients and optimizer state, and the recompute row it asks for.

Names and defaults are Megatron-LM's. Its transformer configuration flags are ``TransformerConfig``'s
fields (``megatron/training/arguments.py`` builds them with ``ArgumentGroupFactory``: ``--field-name``,
a bool that defaults to True as ``--no-field-name`` / ``--disable-field-name``, a field's
``argparse_meta`` names where it has them); here they are read from the installed Megatron Core's
``MLATransformerConfig``, so they are the fields of the revision that builds the model, and every
value given is handed to the real ``TransformerConfig`` (its validator runs on it). The flags
Megatron-LM declares elsewhere and that size memory are mapped one by one (``_MEGATRON_LM_FLAGS``),
with ``validate_args``'s derivations: ``--ffn-hidden-size`` 4h (SwiGLU: 8h/3 down to a multiple of
64), ``--kv-channels`` h / heads, ``--global-batch-size`` micro-batch x DP, sequence parallel off at
TP 1, fp32 gradient accumulation for bf16 unless ``--grad-reduce-in-bf16`` or bf16 main gradients,
the vocabulary padded to a multiple of ``--make-vocab-size-divisible-by`` x TP.

A flag this does not model is looked up in Megatron-LM's own argument groups
(harness/data/megatron-lm/flag-groups-d98e8a64.json, written from its sources by
ci/megatron_lm_flag_groups.py): one of a group that cannot change a training step's memory (logging,
checkpointing, learning-rate schedule, ...: ``NEUTRAL_GROUPS``) is ignored and listed; any other is
refused in one line, as is a flag Megatron-LM does not take.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import types
import typing
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.estimate.model import DENSE, MOE, Architecture, hybrid_layer_kinds
from harness.models import StyleModel
from harness.run.recipes import Parallelism

MEGATRON_LM_COMMIT = "d98e8a64"
# Megatron-LM's argument groups (``_add_<group>_args``) none of whose flags changes what a training
# step allocates on the GPU; the flags of theirs that do are mapped before a flag is looked up here.
NEUTRAL_GROUPS = {
    "logging": "logging and tensorboard",
    "checkpointing": "saving and loading checkpoints",
    "learning_rate": "the learning-rate and weight-decay schedule",
    "regularization": "optimizer hyperparameters (weight decay, clipping, betas, epsilon)",
    "initialization": "initialisation and seeds",
    "validation": "evaluation",
    "tokenizer": "the tokenizer (the vocabulary size is mapped)",
    "data": "datasets and the data loader (the sequence length and attention mask are mapped)",
    "autoresume": "auto-resume",
    "one_logger": "one-logger telemetry",
    "straggler_detector": "straggler detection",
    "ft_package": "fault tolerance",
    "rerun_machine": "the rerun state machine",
    "workload_inspector_server": "the workload inspector",
    "msc": "the multi-storage client",
    "inprocess_restart": "in-process restart",
}
# Flags of the training group that change no allocation of a step: its length, exits, profiling.
NEUTRAL_TRAINING_FLAGS = frozenset(
    {
        "--train-iters",
        "--train-samples",
        "--exit-interval",
        "--exit-duration-in-mins",
        "--exit-signal-handler",
        "--manual-gc",
        "--manual-gc-interval",
        "--no-check-for-nan-in-loss-and-grad",
        "--use-pytorch-profiler",
        "--use-nsys-profiler",
        "--profile-step-start",
        "--profile-step-end",
        "--profile-ranks",
        "--dataloader-type",
    }
)
# TransformerConfig fields Megatron-LM sets from other flags, or that are no flags there
# (arguments.py's exclude list reasons: callables, derived values, different defaults).
_NOT_FLAGS = frozenset(
    {
        "num_moe_experts",
        "gated_linear_unit",
        "activation_func",
        "params_dtype",
        "pipeline_dtype",
        "virtual_pipeline_model_parallel_size",
        "moe_layer_freq",
        "fp8_param",
        "fp4_param",
        "masked_softmax_fusion",
        "bias_dropout_fusion",
        "apply_rope_fusion",
        "persist_layer_norm",
        "gradient_accumulation_fusion",
        "attention_softmax_in_fp32",
        "bias_activation_fusion",
        "overlap_p2p_comm",
        "deallocate_pipeline_outputs",
        "batch_p2p_comm",
    }
)
# Set by the layout, the precision or the row, not handed to the model's config as given.
_LAYOUT_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "sequence_parallel",
)
_ROW_FIELDS = (
    "recompute_granularity",
    "recompute_modules",
    "recompute_method",
    "recompute_num_layers",
)
_PRECISION_FIELDS = ("bf16", "fp16", "fp8", "fp8_recipe", "fp4")
# Given, these change a step's memory in ways plan does not model: refused, naming the flag.
_NOT_MODELLED = {
    "context_parallel_size": "context parallelism (the CPU core attentions have no CP)",
    "mtp_num_layers": "multi-token prediction layers",
    "cuda_graph_impl": "CUDA graphs (their private pools)",
    "enable_cuda_graph": "CUDA graphs (their private pools)",
    "external_cuda_graph": "CUDA graphs (their private pools)",
    "cpu_offloading": "CPU offloading",
    "fine_grained_activation_offloading": "activation offloading",
    "tp_comm_overlap": "userbuffer tensor-parallel overlap",
    "fp4": "FP4",
    "experimental_attention_variant": "experimental attention variants",
}
_ADAM_STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class MegatronLMRun:
    """What a Megatron-LM argument list trains, as memory sees it."""

    flags: tuple[str, ...]
    world_size: int
    arch: Architecture
    parallelism: Parallelism
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    precision: str  # parameter dtype: bf16, fp16, fp32
    vocab_size: int  # padded as Megatron-LM pads it
    untie_embeddings: bool
    position_embedding_type: str
    max_position_embeddings: int
    optimizer: str  # adam or sgd
    distributed_optimizer: bool
    grad_reduce_in_fp32: bool
    main_param_bytes: int
    optimizer_state_bytes: int  # per parameter: Adam's two moments, SGD's momentum
    precision_aware_optimizer: bool
    cross_entropy_fp32_copy: bool
    attention_backend: str  # the estimate's CPU core attention: fused / unfused
    grouped_experts: bool  # TEGroupedMLP experts (TE spec with --moe-grouped-gemm)
    transformer_engine: bool  # --transformer-impl transformer_engine (the default)
    attention_mask_in_batch: bool  # the data loader's [b, 1, s, s] mask
    fp8: str | None  # --fp8-recipe when --fp8-format is given
    fp8_param: bool
    given: RecomputeFields
    ignored: tuple[str, ...]

    @property
    def name(self) -> str:
        return "megatron-lm"

    def worker_json(self) -> str:
        """What a worker rank needs to rebuild this (``parse_megatron_lm`` of the same flags)."""
        return json.dumps({"world_size": self.world_size, "flags": list(self.flags)})


def _strip_optional(hint: Any) -> Any:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else None
    return hint


def _field_kwargs(
    field: dataclasses.Field[Any], hint: Any
) -> tuple[list[str], dict[str, Any]] | None:
    """(flag names, add_argument keywords) Megatron-LM gives a TransformerConfig field; None for a
    field whose type no flag can carry."""
    meta: dict[str, Any] = dict(field.metadata.get("argparse_meta", {}))
    names = meta.pop("arg_names", None)
    default = field.default
    hint = _strip_optional(hint)
    kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS}
    dashed = "--" + field.name.replace("_", "-")
    if hint is bool:
        kwargs["action"] = "store_false" if default is True else "store_true"
        if names is None:
            names = (
                [f"--no-{dashed[2:]}", f"--disable-{dashed[2:]}"] if default is True else [dashed]
            )
        return names, kwargs
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        kwargs["type"] = lambda value, members=hint: members[value]
    elif hint in (int, float, str):
        kwargs["type"] = hint
    elif origin is typing.Literal:
        choices = typing.get_args(hint)
        kwargs.update(type=type(choices[0]), choices=choices)
    elif origin is list and typing.get_args(hint) and typing.get_args(hint)[0] in (int, str, float):
        kwargs.update(type=typing.get_args(hint)[0], nargs="+")
    else:
        return None
    if "type" in meta:
        kwargs["type"] = meta["type"]
    if "choices" in meta:
        kwargs["choices"] = meta["choices"]
    return names or [dashed], kwargs


@cache
def _transformer_flags() -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Field -> (flags, keywords) of every TransformerConfig field Megatron-LM takes as a flag."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    hints = typing.get_type_hints(MLATransformerConfig)
    flags = {}
    for field in dataclasses.fields(MLATransformerConfig):
        if field.name in _NOT_FLAGS or not field.init or field.name.startswith("_"):
            continue
        built = _field_kwargs(field, hints.get(field.name))
        if built is not None:
            flags[field.name] = built
    return flags


def _moe_freq(value: str) -> int | list[int]:
    """Megatron-LM's ``--moe-layer-freq``: an integer, or a list expression such as ``([0]+[1]*3)*2``."""
    if value.isdigit():
        return int(value)
    if set(value) - set("0123456789[]()+*, "):
        raise argparse.ArgumentTypeError(f"not an integer or a list pattern: {value!r}")
    pattern = eval(value, {"__builtins__": {}}, {})  # digits, brackets, + and * only (checked)
    if not isinstance(pattern, list) or not all(v in (0, 1) for v in pattern):
        raise argparse.ArgumentTypeError(f"not a list of 0 and 1: {value!r}")
    return pattern


class _FlagParser(argparse.ArgumentParser):
    """argparse whose errors are the harness's one-line usage errors (no usage text, no exit)."""

    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(f"Megatron-LM flags: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _FlagParser(prog="Megatron-LM flags", allow_abbrev=False, add_help=False)
    for names, kwargs in _transformer_flags().values():
        parser.add_argument(*names, **kwargs)
    add = parser.add_argument
    # Megatron-LM's own flags that size memory (arguments.py at d98e8a64: names and defaults).
    add("--seq-length", type=int, default=None)
    add("--max-position-embeddings", type=int, default=None)
    add("--micro-batch-size", type=int, default=None)
    add("--global-batch-size", type=int, default=None)
    add("--vocab-size", type=int, default=None)
    add("--padded-vocab-size", type=int, default=None)
    add("--make-vocab-size-divisible-by", type=int, default=128)
    add("--untie-embeddings-and-output-weights", action="store_true")
    add(
        "--position-embedding-type",
        default="learned_absolute",
        choices=["learned_absolute", "rope", "yarn", "mrope", "relative", "none"],
    )
    add("--use-rotary-position-embeddings", action="store_true")
    add("--swiglu", action="store_true")
    add("--squared-relu", action="store_true")
    add("--quick-geglu", action="store_true")
    add("--group-query-attention", action="store_true")
    add("--num-experts", type=int, default=None)
    add("--moe-layer-freq", type=_moe_freq, default=1)
    add("--optimizer", default="adam")
    add("--use-distributed-optimizer", action="store_true")
    add("--accumulate-allreduce-grads-in-fp32", action="store_true")
    add("--grad-reduce-in-bf16", action="store_true")
    add("--use-precision-aware-optimizer", action="store_true")
    add("--main-grads-dtype", default="fp32", choices=["fp32", "bf16"])
    add("--main-params-dtype", default="fp32", choices=["fp32", "fp16"])
    add("--exp-avg-dtype", default="fp32", choices=list(_ADAM_STATE_BYTES))
    add("--exp-avg-sq-dtype", default="fp32", choices=list(_ADAM_STATE_BYTES))
    add("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    add("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    add("--recompute-activations", action="store_true")
    add("--fp8-param-gather", action="store_true")
    add("--attention-softmax-in-fp32", action="store_true")
    add("--no-create-attention-mask-in-dataloader", action="store_false", dest="attention_mask")
    add("--hybrid-layer-pattern", default=None)
    # Accepted, the same bytes either way: flash attention is what the fused CPU core attention
    # keeps (q, k, v, output, LSE); OpenAI's GeLU is GeLU; and the kernel fusions below the CPU
    # layers never make (docs/estimate.md), so they are measured unfused whatever is given.
    add("--use-flash-attn", action="store_true")
    add("--openai-gelu", action="store_true")
    for fusion in (
        "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion",
        "--no-bias-swiglu-fusion",
        "--no-bias-dropout-fusion",
        "--no-rope-fusion",
        "--no-persist-layer-norm",
        "--no-gradient-accumulation-fusion",
    ):
        add(fusion, action="store_true")
    return parser


@cache
def flag_groups() -> dict[str, str]:
    """Flag -> Megatron-LM argument group, from the file written from its sources."""
    text = (
        resources.files("harness")
        .joinpath("data", "megatron-lm", f"flag-groups-{MEGATRON_LM_COMMIT}.json")
        .read_text(encoding="utf-8")
    )
    return {flag: group for group, flags in json.loads(text)["groups"].items() for flag in flags}


def _split_unknown(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """Unparsed tokens as (flag, its values): a value belongs to the flag before it."""
    out: list[tuple[str, list[str]]] = []
    for token in tokens:
        if token.startswith("--"):
            flag, _, value = token.partition("=")
            out.append((flag, [value] if value else []))
        elif out:
            out[-1][1].append(token)
        else:
            raise UsageError(f"Megatron-LM flags: {token!r} is not a flag (flags start with --)")
    return out


def _ignored(unknown: list[str]) -> list[str]:
    """The flags that cannot change memory (kept, with their values, to be listed); a usage error
    naming the first flag that could, or that Megatron-LM does not take."""
    groups = flag_groups()
    ignored = []
    for flag, values in _split_unknown(unknown):
        group = groups.get(flag)
        if group in NEUTRAL_GROUPS or flag in NEUTRAL_TRAINING_FLAGS:
            ignored.append(" ".join([flag, *values]))
        elif group is not None:
            raise UsageError(
                f"Megatron-LM flag {flag} ({group} arguments) could change memory and plan does "
                "not model it"
            )
        else:
            raise UsageError(
                f"{flag} is not a Megatron-LM {MEGATRON_LM_COMMIT} flag plan knows "
                "(pretrain_gpt.py / pretrain_mamba.py)"
            )
    return ignored


def _require(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name, None) is None:
            raise UsageError(f"Megatron-LM flags: --{name.replace('_', '-')} is required")


def _activation(args: argparse.Namespace) -> dict[str, Any]:
    """``core_transformer_config_from_args``'s activation: SwiGLU, squared ReLU, quick GeGLU, GeLU."""
    import inspect

    import torch
    from megatron.core.activations import squared_relu
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    if args.swiglu:
        return {"gated_linear_unit": True, "activation_func": torch.nn.functional.silu}
    if args.squared_relu:
        return {"activation_func": inspect.unwrap(squared_relu)}
    if args.quick_geglu:
        return {"gated_linear_unit": True, "activation_func": quick_gelu}
    return {"activation_func": torch.nn.functional.gelu}


def _layer_kinds(config: dict[str, Any], pattern: str | None) -> tuple[str, ...]:
    if pattern:
        return hybrid_layer_kinds(pattern, "--hybrid-layer-pattern")
    layers = config["num_layers"]
    if config.get("num_moe_experts") is None:
        return (DENSE,) * layers
    freq = config["moe_layer_freq"]
    if isinstance(freq, list):
        if len(freq) != layers:
            raise UsageError(
                f"--moe-layer-freq has {len(freq)} entries for {layers} layers (--num-layers)"
            )
        return tuple(MOE if f else DENSE for f in freq)
    return tuple(MOE if i % freq == 0 else DENSE for i in range(layers))


def _given_row(args: argparse.Namespace) -> RecomputeFields:
    granularity = getattr(args, "recompute_granularity", None)
    if args.recompute_activations:
        granularity = "selective"
    modules = getattr(args, "recompute_modules", None)
    if granularity is None:
        return RecomputeFields.parse("[]")  # nothing recomputed: the control
    if granularity == "selective":
        return RecomputeFields(
            granularity="selective", modules=None if modules is None else tuple(modules)
        )
    return RecomputeFields.full(
        getattr(args, "recompute_method", None) or "uniform",
        getattr(args, "recompute_num_layers", None) or 1,
    )


def parse_megatron_lm(flags: list[str], world_size: int) -> MegatronLMRun:
    """The run ``flags`` describe on ``world_size`` GPUs; a usage error (one line) for bad input and
    for what plan cannot model."""
    if world_size < 1:
        raise UsageError(f"--world-size must be at least 1, got {world_size}")
    parser = _parser()
    args, unknown = parser.parse_known_args(flags)
    ignored = _ignored(unknown)
    given = vars(args)
    for field, what in _NOT_MODELLED.items():
        if _active(field, given.get(field)):
            flag = _transformer_flags()[field][0][0]
            raise UsageError(f"Megatron-LM flags: {what} ({flag}) is not modelled")
    if args.optimizer not in ("adam", "sgd"):
        raise UsageError(f"--optimizer {args.optimizer}: plan models adam and sgd")
    _require(
        args, "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size"
    )
    if args.max_position_embeddings is None:
        raise UsageError("Megatron-LM flags: --max-position-embeddings is required")
    if args.padded_vocab_size is None and args.vocab_size is None:
        raise UsageError(
            "Megatron-LM flags: --vocab-size (or --padded-vocab-size) is needed: plan reads no "
            "tokenizer"
        )
    tp = given.get("tensor_model_parallel_size", 1)
    pp = given.get("pipeline_model_parallel_size", 1)
    cp = given.get("context_parallel_size", 1)
    if world_size % (tp * pp * cp):
        raise UsageError(
            f"--world-size {world_size} is not a multiple of TP x PP x CP ({tp} x {pp} x {cp})"
        )
    dp = world_size // (tp * pp * cp)
    layers = args.num_layers
    vpp = args.num_virtual_stages_per_pipeline_rank
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if layers % pp or (layers // pp) % args.num_layers_per_virtual_pipeline_stage:
            raise UsageError(
                f"--num-layers-per-virtual-pipeline-stage {args.num_layers_per_virtual_pipeline_stage}"
                f" does not divide the {layers} layers' {layers // max(pp, 1)} per stage"
            )
        vpp = layers // pp // args.num_layers_per_virtual_pipeline_stage
    layout = Parallelism(
        tp=tp,
        pp=pp,
        cp=cp,
        ep=given.get("expert_model_parallel_size", 1),
        etp=given.get("expert_tensor_parallel_size"),
        vpp=None if vpp in (None, 1) else vpp,
    )
    precision = "bf16" if given.get("bf16") else "fp16" if given.get("fp16") else "fp32"
    hidden, heads = args.hidden_size, args.num_attention_heads
    config: dict[str, Any] = {
        key: value
        for key, value in given.items()
        if key in _transformer_flags()
        and key not in (*_LAYOUT_FIELDS, *_ROW_FIELDS, *_PRECISION_FIELDS)
        and key not in ("transformer_impl", "attention_backend", "fp8_recipe")
    }
    config.update(_activation(args))
    if config.get("ffn_hidden_size") is None:
        config["ffn_hidden_size"] = (
            int((4 * hidden * 2 / 3) / 64) * 64 if args.swiglu else 4 * hidden
        )
    config.setdefault("kv_channels", hidden // heads)
    for dropout in ("hidden_dropout", "attention_dropout"):  # Megatron-LM's defaults: the config's
        config.setdefault(dropout, _config_default(dropout))
    if not args.group_query_attention:
        config.pop("num_query_groups", None)
    if args.num_experts is not None:
        config["num_moe_experts"] = args.num_experts
        config["moe_layer_freq"] = args.moe_layer_freq
        config.setdefault("moe_ffn_hidden_size", config["ffn_hidden_size"])
    config["attention_softmax_in_fp32"] = args.attention_softmax_in_fp32
    if args.hybrid_layer_pattern:
        config["is_hybrid_model"] = True
    vocab = args.padded_vocab_size or _padded_vocab(
        args.vocab_size, args.make_vocab_size_divisible_by, tp
    )
    position = "rope" if args.use_rotary_position_embeddings else args.position_embedding_type
    if position not in ("rope", "learned_absolute", "none"):
        raise UsageError(f"--position-embedding-type {position} is not modelled")
    style = StyleModel(
        name="megatron-lm",
        description="the model of a Megatron-LM argument list",
        config_kwargs=config,
        vocab_size=vocab,
        seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size,
        mla=bool(config.get("multi_latent_attention")),
        hybrid_pattern=args.hybrid_layer_pattern or "",
    )
    arch = Architecture(
        style,
        f"Megatron-LM {MEGATRON_LM_COMMIT} flags",
        _layer_kinds(config, args.hybrid_layer_pattern),
        te_grouped_experts=given.get("transformer_impl", "transformer_engine")
        == "transformer_engine",
    )
    # Gradients: bf16 accumulates and all-reduces in fp32 unless told otherwise (validate_args).
    fp32_grads = args.accumulate_allreduce_grads_in_fp32 or (
        precision == "bf16" and not args.grad_reduce_in_bf16 and args.main_grads_dtype == "fp32"
    )
    if args.optimizer == "adam":
        state = (
            _ADAM_STATE_BYTES[args.exp_avg_dtype] + _ADAM_STATE_BYTES[args.exp_avg_sq_dtype]
            if args.use_precision_aware_optimizer
            else 8
        )
    else:
        state = 4  # SGD's momentum buffer, fp32
    main = 2 if args.use_precision_aware_optimizer and args.main_params_dtype == "fp16" else 4
    transformer_impl = given.get("transformer_impl", "transformer_engine")
    backend = given.get("attention_backend")
    local_attention = transformer_impl == "local" or getattr(backend, "name", "") in (
        "local",
        "unfused",
    )
    fusion = given.get("cross_entropy_loss_fusion", False)
    fusion_impl = given.get("cross_entropy_fusion_impl", "native")
    gbs = args.global_batch_size or args.micro_batch_size * dp
    return MegatronLMRun(
        flags=tuple(flags),
        world_size=world_size,
        arch=arch,
        parallelism=layout,
        seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size,
        global_batch_size=gbs,
        precision=precision,
        vocab_size=vocab,
        untie_embeddings=args.untie_embeddings_and_output_weights,
        position_embedding_type=position,
        max_position_embeddings=args.max_position_embeddings,
        optimizer=args.optimizer,
        distributed_optimizer=args.use_distributed_optimizer,
        grad_reduce_in_fp32=fp32_grads,
        main_param_bytes=main,
        optimizer_state_bytes=state,
        precision_aware_optimizer=args.use_precision_aware_optimizer,
        cross_entropy_fp32_copy=not (fusion and fusion_impl == "te"),
        attention_backend="unfused" if local_attention else "fused",
        grouped_experts=transformer_impl == "transformer_engine"
        and bool(config.get("moe_grouped_gemm")),
        transformer_engine=transformer_impl == "transformer_engine",
        attention_mask_in_batch=args.attention_mask,
        fp8=given.get("fp8_recipe", _config_default("fp8_recipe")) if given.get("fp8") else None,
        fp8_param=args.fp8_param_gather,
        given=_given_row(args),
        ignored=tuple(ignored),
    )


def _active(field: str, value: Any) -> bool:
    """Whether a given TransformerConfig value turns its feature on (CP 1, zero MTP layers and
    ``none`` CUDA graphs are off)."""
    if field == "context_parallel_size":
        return value not in (None, 1)
    return value not in (None, False, 0, "none")


def _config_default(field: str) -> Any:
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    return MLATransformerConfig.__dataclass_fields__[field].default


def _padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron's ``vocab_size_with_padding``: up to a multiple of ``divisible_by`` x TP."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab / multiple) * multiple)
