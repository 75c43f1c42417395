"""A Megatron-LM argument list read as Megatron-LM d98e8a64 reads it: names, defaults and the
derivations of its ``validate_args`` (megatron/training/arguments.py), on the installed Megatron
Core's TransformerConfig."""

from __future__ import annotations

import shlex

import pytest

from harness.errors import UsageError
from harness.estimate.megatron_lm import parse_megatron_lm

# A Llama-3-8B-style dense GPT on 16 GPUs.
DENSE = shlex.split(
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
    "--num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
    "--tensor-model-parallel-size 2 --sequence-parallel --bf16 --use-distributed-optimizer "
    "--swiglu --normalization RMSNorm --disable-bias-linear --position-embedding-type rope "
    "--vocab-size 128256 --lr 3e-4 --log-interval 1"
)


def test_defaults_are_megatron_lms_own():
    run = parse_megatron_lm(DENSE, 16)
    config = run.arch.config
    # --ffn-hidden-size absent under --swiglu: int(4h * 2/3 / 64) * 64 (validate_args)
    assert config["ffn_hidden_size"] == int(4 * 4096 * 2 / 3 / 64) * 64 == 10880
    assert config["kv_channels"] == 4096 // 32
    # no --global-batch-size: micro-batch x data parallel (16 GPUs / TP 2)
    assert run.global_batch_size == 1 * 8
    # --bf16 without --grad-reduce-in-bf16 accumulates and all-reduces gradients in fp32
    assert run.grad_reduce_in_fp32 is True
    # the vocabulary padded to a multiple of 128 x TP (vocab_size_with_padding)
    assert run.vocab_size % (128 * 2) == 0 and 0 <= run.vocab_size - 128256 < 128 * 2
    # TransformerConfig's dropout defaults, as Megatron-LM hands them over
    assert config["hidden_dropout"] == config["attention_dropout"] == 0.1
    assert run.untie_embeddings is False and run.position_embedding_type == "rope"
    assert run.given.name == "[]"  # no recompute flag: nothing recomputed


def test_recompute_and_layout_flags_make_the_given_row_and_the_interleaved_layout():
    flags = DENSE + shlex.split(
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 "
        "--recompute-granularity full --recompute-method block --recompute-num-layers 3"
    )
    run = parse_megatron_lm(flags, 32)
    assert run.parallelism.pp == 4 and run.parallelism.vpp == 32 // 4 // 2
    assert run.given.name == "full-block-3"


def test_flags_of_memory_neutral_groups_are_listed_with_their_values():
    run = parse_megatron_lm([*DENSE, "--save", "ckpt", "--seed", "7"], 16)
    assert run.ignored == ("--lr 3e-4", "--log-interval 1", "--save ckpt", "--seed 7")


def test_fp8_takes_the_configs_default_recipe_unless_one_is_given():
    from megatron.core.transformer.transformer_config import TransformerConfig

    default = TransformerConfig.__dataclass_fields__["fp8_recipe"].default
    assert parse_megatron_lm([*DENSE, "--fp8-format", "hybrid"], 16).fp8 == default
    given = [*DENSE, "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
    assert parse_megatron_lm(given, 16).fp8 == "tensorwise"
    assert parse_megatron_lm(DENSE, 16).fp8 is None


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--frobnicate"], "--frobnicate is not a Megatron-LM d98e8a64 flag"),
        (["--use-megatron-fsdp"], "Megatron FSDP (--use-megatron-fsdp) is not modelled"),
        (
            ["--cpu-offloading-num-layers", "2"],
            "CPU offloading (--cpu-offloading-num-layers) is not modelled",
        ),
        (["--context-parallel-size", "2"], "context parallelism"),
        (["--optimizer", "muon"], "--optimizer muon: plan models adam and sgd"),
    ],
)
def test_what_plan_cannot_model_is_refused_naming_the_flag(extra, says):
    with pytest.raises(UsageError, match=None) as refused:
        parse_megatron_lm([*DENSE, *extra], 16)
    assert says in str(refused.value)


def test_a_world_that_the_layout_does_not_divide_is_refused():
    with pytest.raises(UsageError, match="not a multiple of TP x PP x CP"):
        parse_megatron_lm(DENSE, 15)
