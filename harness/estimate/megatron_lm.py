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

Every other flag is looked up in Megatron-LM's own flag table
(harness/data/megatron-lm/flags-d98e8a64.json, written from its sources by ci/megatron_lm_flags.py,
flag by flag from where its destination is read): a ``neutral`` flag (one no code that builds a
step's tensors reads) is ignored and listed; a ``memory`` flag plan does not model is refused in one
line naming its feature; a flag Megatron-LM does not take is refused too.
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
from pathlib import Path
from typing import Any

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.estimate.model import DENSE, MOE, Architecture, hybrid_layer_kinds
from harness.models import StyleModel
from harness.run.recipes import Parallelism

MEGATRON_LM_COMMIT = "d98e8a64"
FLAG_TABLE = f"flags-{MEGATRON_LM_COMMIT}.json"
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
    "mtp_num_layers": "multi-token prediction layers",
    "cuda_graph_impl": "CUDA graphs (their private pools)",
    "enable_cuda_graph": "CUDA graphs (their private pools)",
    "external_cuda_graph": "CUDA graphs (their private pools)",
    "cpu_offloading_num_layers": "CPU offloading",
    "fine_grained_activation_offloading": "activation offloading",
    "tp_comm_overlap": "userbuffer tensor-parallel overlap",
    "fp4": "FP4",
    "experimental_attention_variant": "experimental attention variants",
    # TE's op-fuser implementation of the MLP / grouped experts: TE-only code, no CPU counterpart
    # (MCore asserts its fused GroupedMLP is supported, and the CPU stand-ins are not).
    "use_transformer_engine_op_fuser": "Transformer Engine's op fuser (fused MLP)",
    # MoE all-to-all overlapped with another micro-batch's compute (the combined 1F1B schedule).
    "overlap_moe_expert_parallel_comm": "expert-parallel communication overlap",
}
# The features of Megatron-LM's other flags that change what a step allocates, by destination, for
# the refusal's one line (any other such flag is named by the code that reads it).
_FEATURES = {
    "use_megatron_fsdp": "Megatron FSDP",
    "use_torch_fsdp2": "torch FSDP2",
    "data_parallel_sharding_strategy": "Megatron FSDP",
    "pipeline_model_parallel_layout": "a pipeline layout",
    "cuda_graph_modules": "CUDA graphs (their private pools)",
    "cuda_graph_scope_deprecated": "CUDA graphs (their private pools)",
    "hierarchical_context_parallel_sizes": "hierarchical context parallelism",
    "linear_attention_freq": "linear attention layers",
    "optimizer_cpu_offload": "optimizer CPU offload",
    "heterogeneous_layers_config_path": "heterogeneous layers",
    "moe_use_upcycling": "MoE upcycling",
}
# arguments.py's _add_mla_args defaults at d98e8a64.
_MLA_DEFAULTS = {
    "q_lora_rank": None,
    "kv_lora_rank": 32,
    "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128,
    "rotary_scaling_factor": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.0,
}
# The layer specs Megatron-LM's builders take by --spec that are the ones plan builds: the hybrid
# stack's (hybrid_builders.py requires one; this is the TE spec pretrain_hybrid.py runs).
_KNOWN_SPECS = frozenset({("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec")})
# Tokenizers whose vocabulary needs no file: GPT-2's BPE (the GPT-2 vocabulary, 50257 entries:
# MegatronHFTokenizer loads "gpt2"), tiktoken (vocab_size defaults to DEFAULT_TIKTOKEN_MAX_VOCAB,
# 2**17, whatever the file holds: tiktoken_tokenizer.py).
_TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "TikTokenizer": 2**17}
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
    distributed_optimizer_instances: int
    stage_layers: tuple[int, ...] | None  # an uneven pipeline's layers per virtual stage
    # --defer-embedding-wgrad-compute: None off, else --wgrad-deferral-limit (0: every micro-batch)
    deferred_embedding_wgrad: int | None
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
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    hints = typing.get_type_hints(MLATransformerConfig)
    # Megatron-LM builds these flags from TransformerConfig: a field MLATransformerConfig redefines
    # (``multi_latent_attention``, True there) takes TransformerConfig's default, as its flag does.
    base = {field.name: field for field in dataclasses.fields(TransformerConfig)}
    in_table = {entry["dest"] for entry in flag_table().values()}
    flags = {}
    for field in dataclasses.fields(MLATransformerConfig):
        if field.name in _NOT_FLAGS or not field.init or field.name.startswith("_"):
            continue
        if field.name not in in_table:  # no Megatron-LM flag at this revision
            continue
        built = _field_kwargs(base.get(field.name, field), hints.get(field.name))
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
    add(
        "--hybrid-override-pattern", default=None
    )  # validate_args: the deprecated name of the above
    add("--spec", nargs="+", default=None)
    # Routing's load balancing and its loss coefficient: handed to the config (one value: a str /
    # float, as validate_args makes it); the CPU MoE layers are measured with them.
    add("--moe-router-load-balancing-type", nargs="+", default=None)
    add("--moe-aux-loss-coeff", nargs="+", type=float, default=None)
    # Tokenizers: the vocabulary size (``tokenizer_vocab``).
    add("--tokenizer-type", default="GPT2BPETokenizer")  # pretrain_gpt.py's args_defaults
    add("--vocab-file", default=None)
    add("--merge-file", default=None)
    add("--tokenizer-model", default=None)
    # MCore DDP's buckets and their overlap: the gradient (and, with the distributed optimizer,
    # parameter) buffer is one allocation whichever way it is bucketed and whenever a bucket is
    # reduced or gathered (param_and_grad_buffer.py); buckets add only their end padding to a
    # multiple of DP (distributed optimizer), under DP x 128 elements a bucket.
    for same_buffers in (
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--no-align-param-gather",
        "--ddp-average-in-collective",
        "--no-gradient-reduce-div-fusion",
        "--ddp-pad-buckets-for-high-nccl-busbw",
        "--overlap-param-gather-with-optimizer-step",
    ):
        add(same_buffers, action="store_true")
    add("--ddp-bucket-size", type=int, default=None)
    add("--num-distributed-optimizer-instances", type=int, default=1)
    add("--decoder-first-pipeline-num-layers", type=int, default=None)
    add("--decoder-last-pipeline-num-layers", type=int, default=None)
    add("--cp-comm-type", nargs="+", default=["p2p"])
    # Pipeline P2P overlap: Megatron-LM's default on (store_false), off without virtual stages
    # (validate_args); batch_p2p_comm is its negation (core_transformer_config_from_args). Both
    # send and receive the same activation tensors.
    add("--no-overlap-p2p-communication", action="store_false", dest="overlap_p2p_comm")
    add("--ddp-num-buckets", type=int, default=None)
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
def flag_table() -> dict[str, dict[str, str]]:
    """Flag -> {dest, group, kind: neutral | memory, why | site}, from the file written from
    Megatron-LM's sources (ci/megatron_lm_flags.py)."""
    text = (
        resources.files("harness")
        .joinpath("data", "megatron-lm", FLAG_TABLE)
        .read_text(encoding="utf-8")
    )
    table: dict[str, dict[str, str]] = json.loads(text)["flags"]
    return table


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
    """The neutral flags (kept, with their values, to be listed); a usage error naming the feature
    of the first flag that changes what a step allocates and plan does not model, or the first
    flag Megatron-LM does not take."""
    table = flag_table()
    ignored = []
    for flag, values in _split_unknown(unknown):
        entry = table.get(flag)
        if entry is None:
            raise UsageError(
                f"{flag} is not a Megatron-LM {MEGATRON_LM_COMMIT} flag "
                "(pretrain_gpt.py / pretrain_hybrid.py)"
            )
        if entry["kind"] == "neutral":
            ignored.append(" ".join([flag, *values]))
            continue
        dest = entry["dest"]
        if dest.startswith("muon_"):
            feature = "the Muon optimizer"
        elif entry["group"] == "modelopt":
            feature = "ModelOpt post-training (distillation, quantization, its own model builder)"
        else:
            feature = (
                _FEATURES.get(dest)
                or _NOT_MODELLED.get(dest)
                or f"what {flag} sets (read in {entry['site']})"
            )
        raise UsageError(f"Megatron-LM flags: {feature} ({flag}) is not modelled")
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
    if args.hybrid_override_pattern is not None:
        if args.hybrid_layer_pattern is not None:
            raise UsageError(
                "Megatron-LM flags: --hybrid-override-pattern and --hybrid-layer-pattern cannot "
                "both be given"
            )
        args.hybrid_layer_pattern = args.hybrid_override_pattern
    _check_spec(args.spec, hybrid=args.hybrid_layer_pattern is not None)
    if args.hybrid_layer_pattern is not None:
        args.hybrid_layer_pattern, segments = _pipeline_segments(
            args.hybrid_layer_pattern, given.get("pipeline_model_parallel_size", 1)
        )
        if segments is not None:
            args.num_virtual_stages_per_pipeline_rank = segments
        # validate_args: the pattern's layer count replaces --num-layers
        args.num_layers = len(_layer_kinds({}, args.hybrid_layer_pattern))
        given["num_layers"] = args.num_layers
    _require(
        args, "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size"
    )
    if args.max_position_embeddings is None:
        raise UsageError("Megatron-LM flags: --max-position-embeddings is required")
    if args.padded_vocab_size is None and args.vocab_size is None:
        args.vocab_size = tokenizer_vocab(args)
        if args.vocab_file is not None and not Path(args.vocab_file).is_file():
            # listed with the ignored flags: the size is the type's, not the file's
            ignored.append(
                f"--vocab-file {args.vocab_file} (not on this machine: {args.tokenizer_type}'s "
                f"{args.vocab_size} entries assumed)"
            )
    tp = given.get("tensor_model_parallel_size", 1)
    pp = given.get("pipeline_model_parallel_size", 1)
    cp = given.get("context_parallel_size", 1)
    if world_size % (tp * pp * cp):
        raise UsageError(
            f"--world-size {world_size} is not a multiple of TP x PP x CP ({tp} x {pp} x {cp})"
        )
    dp = world_size // (tp * pp * cp)
    if cp > 1:
        _check_context_parallel(args, given, cp)
    if dp % args.num_distributed_optimizer_instances:
        raise UsageError(
            f"Megatron-LM flags: --num-distributed-optimizer-instances "
            f"{args.num_distributed_optimizer_instances} does not divide data parallel {dp}"
        )
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
    # The output layer's deferred weight gradient is the stage's, not a decoder layer's (and MCore
    # refuses it without PP, which the CPU layers run): carried beside the config.
    deferred = config.pop("defer_embedding_wgrad_compute", False)
    deferral_limit = config.pop("wgrad_deferral_limit", 0)
    stage_layers = _virtual_stage_layers(args, config, pp, vpp)
    for split in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        config.pop(split, None)  # the pipeline's split (above), not a layer's
    # validate_args: P2P overlap only under the interleaved schedule; the config's batch_p2p_comm
    # is its negation
    overlap_p2p = bool(args.overlap_p2p_comm and vpp not in (None, 1))
    config["overlap_p2p_comm"] = overlap_p2p
    config["batch_p2p_comm"] = not overlap_p2p
    if not config.get("multi_latent_attention"):
        # MLATransformerConfig's own fields (--rotary-percent, ...) reach GPTModel, not a
        # TransformerConfig, in Megatron-LM's builders; the rotary share changes no allocation.
        from megatron.core.transformer.transformer_config import TransformerConfig

        plain = set(TransformerConfig.__dataclass_fields__)
        config = {key: value for key, value in config.items() if key in plain}
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
    if args.moe_router_load_balancing_type is not None:
        kinds = args.moe_router_load_balancing_type
        config["moe_router_load_balancing_type"] = kinds[0] if len(kinds) == 1 else kinds
    if args.moe_aux_loss_coeff is not None:
        coeffs = args.moe_aux_loss_coeff
        config["moe_aux_loss_coeff"] = coeffs[0] if len(coeffs) == 1 else coeffs
    if config.get("multi_latent_attention"):
        # Megatron-LM's own defaults of its MLA flags (_add_mla_args), not MLATransformerConfig's:
        # core_transformer_config_from_args copies every one into the config.
        for field, default in _MLA_DEFAULTS.items():
            config.setdefault(field, default)
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
        distributed_optimizer_instances=args.num_distributed_optimizer_instances,
        stage_layers=stage_layers,
        deferred_embedding_wgrad=deferral_limit if deferred else None,
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


def _virtual_stage_layers(
    args: argparse.Namespace, config: dict[str, Any], pp: int, vpp: int | None
) -> tuple[int, ...] | None:
    """Decoder layers of each virtual pipeline stage (``v = chunk * PP + rank``, layers assigned in
    that order) where MCore's split is uneven: ``get_num_layers_to_build``
    (transformer_block.py) with ``--decoder-first/last-pipeline-num-layers`` (those stages take what
    is given, the stages between share the rest, each stage's over its chunks) or
    ``--account-for-embedding/loss-in-pipeline-split`` (the embedding and the loss counted as
    layers of the first and last virtual stage); None for the even split."""
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    embedding = bool(config.get("account_for_embedding_in_pipeline_split"))
    loss = bool(config.get("account_for_loss_in_pipeline_split"))
    if first is None and last is None and not embedding and not loss:
        return None
    if pp == 1:
        raise UsageError("Megatron-LM flags: an uneven pipeline split needs pipeline parallelism")
    chunks = vpp or 1
    layers = args.num_layers
    if first is not None or last is not None:
        if embedding or loss:
            raise UsageError(
                "Megatron-LM flags: --decoder-first/last-pipeline-num-layers do not go with "
                "--account-for-embedding/loss-in-pipeline-split (MCore refuses both)"
            )
        middle = pp - (first is not None) - (last is not None)
        rest = layers - (first or 0) - (last or 0)
        if rest < 0 or (middle == 0 and rest) or (middle and rest % middle):
            raise UsageError(
                f"Megatron-LM flags: {layers} layers less the first stage's {first or 0} and "
                f"the last's {last or 0} do not split evenly over the {middle} stage(s) between"
            )
        per_rank = [rest // middle if middle else 0] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        total = layers + embedding + loss
        if total % pp:
            raise UsageError(
                f"Megatron-LM flags: {layers} layers with the embedding / loss counted do not "
                f"split evenly over PP {pp}"
            )
        per_rank = [total // pp] * pp
    if any(count % chunks for count in per_rank):
        raise UsageError(
            f"Megatron-LM flags: the stages' {'/'.join(map(str, per_rank))} layers do not split "
            f"over {chunks} virtual stages"
        )
    stages = [per_rank[v % pp] // chunks for v in range(pp * chunks)]
    stages[0] -= embedding
    stages[-1] -= loss
    if min(stages) < 0 or sum(stages) != layers:
        raise UsageError("Megatron-LM flags: not enough layers for the uneven pipeline split")
    return tuple(stages)


def _pipeline_segments(pattern: str, pp: int) -> tuple[str, int | None]:
    """A hybrid pattern's ``|`` pipeline segments (validate_args: they lay out the pipeline, their
    count over PP the virtual stages): the pattern without them, and the virtual stages per rank
    (None without segments). Segments of unequal layer counts are an uneven pipeline: refused."""
    from megatron.core.models.hybrid.hybrid_layer_allocation import Symbols

    if Symbols.PIPE not in pattern:
        return pattern, None
    segments = pattern.split(Symbols.PIPE)
    if len({len(segment) for segment in segments}) != 1 or len(segments) % pp:
        raise UsageError(
            "Megatron-LM flags: uneven pipelines (--hybrid-layer-pattern segments of "
            f"{'/'.join(str(len(s)) for s in segments)} layers over PP {pp}) are not modelled"
        )
    return "".join(segments), len(segments) // pp


# Context parallelism's KV exchanges whose saved tensors are a local attention's: ring P2P (TE's
# AttnFuncWithCPAndKVP2P saves this rank's q, k, v, output and softmax statistics of its s / CP
# tokens and exchanges K/V again in backward) and all-to-all (attention over the whole sequence
# with heads / CP: the same elements). Every one runs on s / CP tokens a rank.
_CP_EXCHANGES = ("p2p", "a2a")


def _check_context_parallel(args: argparse.Namespace, given: dict[str, Any], cp: int) -> None:
    """Context parallelism as plan models it (a rank's layers on s / CP tokens, measured as the
    fused attention there), or a usage error naming what it does not model."""
    if len(args.cp_comm_type) != 1 or args.cp_comm_type[0] not in _CP_EXCHANGES:
        raise UsageError(
            f"Megatron-LM flags: context parallelism's {' '.join(args.cp_comm_type)} KV exchange "
            "(--cp-comm-type) is not modelled (p2p and a2a are)"
        )
    backend = getattr(given.get("attention_backend"), "name", "")
    if given.get("transformer_impl") == "local" or backend in ("local", "unfused"):
        raise UsageError(
            "Megatron-LM flags: context parallelism with the unfused core attention is not "
            "modelled (MCore runs CP in TE's attention only)"
        )
    if args.seq_length is not None and args.seq_length % (2 * cp):
        raise UsageError(
            f"Megatron-LM flags: --seq-length {args.seq_length} does not split into 2 x CP "
            f"({2 * cp}) chunks (get_batch_on_this_cp_rank)"
        )


def _check_spec(spec: list[str] | None, hybrid: bool) -> None:
    """``--spec MODULE NAME``: the spec plan builds (the hybrid stack's) or a usage error."""
    if spec is None:
        if hybrid:
            raise UsageError(
                "Megatron-LM flags: a hybrid model needs --spec (hybrid_builders.py), e.g. "
                "megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec"
            )
        return
    if tuple(spec) in _KNOWN_SPECS and hybrid:
        return
    raise UsageError(
        f"Megatron-LM flags: a custom layer spec (--spec {' '.join(spec)}) is not modelled"
    )


def tokenizer_vocab(args: argparse.Namespace) -> int:
    """The tokenizer's vocabulary size, before padding, as build_tokenizer's tokenizer reports it
    (megatron/core/tokenizers at d98e8a64): from the vocabulary file where one is given and
    exists, else the type's own size; a usage error asking for --vocab-size otherwise."""
    kind = args.tokenizer_type
    if kind == "TikTokenizer":
        return _TOKENIZER_VOCAB[kind]  # --vocab-size is read before this; the file is not needed
    path = args.vocab_file if kind == "GPT2BPETokenizer" else args.tokenizer_model
    if path is not None and kind in ("GPT2BPETokenizer", "HuggingFaceTokenizer"):
        counted = _count_vocab(path)
        if counted is not None:
            return counted
    if path is not None and kind in _SENTENCEPIECE and Path(path).is_file():
        return _count_pieces(Path(path))
    if kind in _TOKENIZER_VOCAB:
        return _TOKENIZER_VOCAB[kind]
    where = f" ({path} is not readable here)" if path else ""
    raise UsageError(
        f"Megatron-LM flags: --tokenizer-type {kind}'s vocabulary size needs its file{where}: "
        "give --vocab-size"
    )


# build_tokenizer's SentencePiece types: the model's pieces (get_piece_size), special tokens added
# only by --tokenizer-special-tokens under the legacy tokenizer (not counted here).
_SENTENCEPIECE = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


def _count_pieces(path: Path) -> int:
    """The pieces of a SentencePiece ``.model`` (a ``ModelProto``: field 1, ``pieces``, repeated),
    read from its protobuf wire format without the sentencepiece library."""
    data = path.read_bytes()

    def varint(at: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            if at >= len(data):
                raise UsageError(f"Megatron-LM flags: {path} is not a SentencePiece model")
            byte = data[at]
            value |= (byte & 0x7F) << shift
            at += 1
            if byte < 0x80:
                return value, at
            shift += 7

    pieces, at = 0, 0
    while at < len(data):
        key, at = varint(at)
        wire = key & 7
        if wire == 0:
            _, at = varint(at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length, at = varint(at)
            pieces += key >> 3 == 1
            at += length
        else:
            raise UsageError(f"Megatron-LM flags: {path} is not a SentencePiece model")
    return pieces


def _count_vocab(path: str) -> int | None:
    """Entries of a GPT-2 ``vocab.json`` or a Hugging Face ``tokenizer.json`` (its model's
    vocabulary plus the added tokens outside it); None when there is no such file."""
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as unreadable:
        raise UsageError(f"Megatron-LM flags: {path} is not a vocabulary: {unreadable}") from None
    if isinstance(document.get("model"), dict):  # tokenizer.json
        vocab = document["model"].get("vocab", {})
        added = {t["content"] for t in document.get("added_tokens", [])} - set(vocab)
        return len(vocab) + len(added)
    return len(document)


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
