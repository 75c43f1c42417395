"""A Megatron-LM argument list read as Megatron-LM d98e8a64 reads it: names, defaults and the
derivations of its ``validate_args`` (megatron/training/arguments.py), on the installed Megatron
Core's TransformerConfig."""

from __future__ import annotations

import json
import shlex

import pytest
from megatron_lm_scripts import mirror_or_skip, script

from harness.errors import UsageError
from harness.estimate.megatron_lm import MEGATRON_LM_COMMIT, flag_table, parse_megatron_lm

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
        (["--mtp-num-layers", "1"], "multi-token prediction layers (--mtp-num-layers)"),
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


def test_the_flag_table_holds_every_flag_megatron_lms_parser_defines():
    # A flag Megatron-LM adds at this revision and the table lacks fails here: rerun
    # ci/megatron_lm_flags.py (it decides the new flag from where its destination is read).
    repo = mirror_or_skip()
    defined = script("megatron_lm_flags").parser_flags(repo, MEGATRON_LM_COMMIT)
    table = flag_table()
    assert sorted(set(defined) - set(table)) == []
    assert {entry["kind"] for entry in table.values()} == {"neutral", "memory"}
    assert all(entry.get("why") or entry.get("site") for entry in table.values())


@pytest.mark.parametrize(
    "flag",
    [
        "--distributed-backend",
        "--distributed-timeout-minutes",
        "--use-mcore-models",
        "--use-tp-pp-dp-mapping",
        "--check-weight-hash-across-dp-replicas-interval",
        "--lr",
        "--save",
        "--seed",
    ],
)
def test_flags_that_cannot_change_memory_are_neutral_and_listed(flag):
    # the first refusals: none reaches a step's tensors (the table says why)
    assert flag_table()[flag]["kind"] == "neutral"
    value = [] if flag == "--use-mcore-models" else ["x" if flag == "--save" else "1"]
    if flag in ("--distributed-backend",):
        value = ["nccl"]
    run = parse_megatron_lm([*DENSE, flag, *value], 16)
    assert " ".join([flag, *value]) in run.ignored


def test_the_router_load_balancing_type_reaches_the_config():
    moe = [*DENSE, "--num-experts", "8", "--moe-router-load-balancing-type", "seq_aux_loss"]
    assert (
        parse_megatron_lm(moe, 16).arch.config["moe_router_load_balancing_type"] == "seq_aux_loss"
    )


def test_tokenizers_give_their_vocabulary_as_megatron_lm_builds_it(tmp_path):
    without = [f for f in DENSE if f not in ("--vocab-size", "128256")]
    # pretrain_gpt.py's default tokenizer type is GPT-2's BPE: 50257 entries, padded to 128 x TP 2
    assert parse_megatron_lm(without, 16).vocab_size == 50432
    # its vocabulary file, read when it exists
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({f"t{i}": i for i in range(300)}))
    assert parse_megatron_lm([*without, "--vocab-file", str(vocab)], 16).vocab_size == 512
    # a vocabulary file not on this machine: the type's size, and the assumption listed
    absent = parse_megatron_lm([*without, "--vocab-file", "/absent/vocab.json"], 16)
    assert absent.vocab_size == 50432
    assert (
        "--vocab-file /absent/vocab.json (not on this machine: GPT2BPETokenizer's 50257 "
        in (absent.ignored[-1])
    )
    # TikTokenizer: DEFAULT_TIKTOKEN_MAX_VOCAB (2**17) without --vocab-size
    tik = [*without, "--tokenizer-type", "TikTokenizer", "--tokenizer-model", "/absent"]
    assert parse_megatron_lm(tik, 16).vocab_size == 2**17
    # a Hugging Face tokenizer.json: its vocabulary plus the added tokens outside it
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "tokenizer.json").write_text(
        json.dumps(
            {
                "model": {"vocab": {"a": 0, "b": 1}},
                "added_tokens": [{"content": "b"}, {"content": "<eos>"}],
            }
        )
    )
    # (padded to a multiple of 1 x TP 2 here, so the count shows)
    exact = [*without, "--make-vocab-size-divisible-by", "1"]
    hf = [*exact, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model"]
    assert parse_megatron_lm([*hf, str(tmp_path / "hf")], 16).vocab_size == 4  # a, b, <eos>
    with pytest.raises(UsageError, match="needs its file .*: give --vocab-size$"):
        parse_megatron_lm([*hf, "/absent/tokenizer"], 16)
    # a SentencePiece model: its pieces (ModelProto field 1), here five, each a piece string,
    # a score and a type, and a trainer spec (field 2) that is no piece
    piece = bytes([0x0A, 1, ord("a"), 0x15, 0, 0, 0, 0, 0x18, 1])
    model = tmp_path / "sp.model"
    model.write_bytes((bytes([0x0A, len(piece)]) + piece) * 5 + bytes([0x12, 2, 0x08, 1]))
    sp = [*exact, "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model"]
    assert parse_megatron_lm([*sp, str(model)], 16).vocab_size == 6
    with pytest.raises(UsageError, match="NullTokenizer's vocabulary size needs its file"):
        parse_megatron_lm([*without, "--tokenizer-type", "NullTokenizer"], 16)


def test_a_hybrid_stack_is_sized_by_its_pattern_and_built_from_its_spec():
    hybrid = shlex.split(
        "--hidden-size 256 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings "
        "1024 --micro-batch-size 1 --bf16 --vocab-size 1000 --position-embedding-type none"
    )
    spec = ["--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]
    run = parse_megatron_lm([*hybrid, "--hybrid-override-pattern", "M*M-", *spec], 16)
    assert run.arch.config["num_layers"] == 4
    assert run.arch.layer_kinds == ("mamba", "attention", "mamba", "mlp")
    with pytest.raises(UsageError, match="a hybrid model needs --spec"):
        parse_megatron_lm([*hybrid, "--hybrid-layer-pattern", "M*M-"], 16)
    with pytest.raises(UsageError, match="a custom layer spec .* is not modelled"):
        parse_megatron_lm([*DENSE, "--spec", "my.module", "my_spec"], 16)


def test_multi_latent_attention_is_megatron_lms_flag_with_its_defaults():
    mla = [f for f in DENSE if f not in ("--group-query-attention", "--num-query-groups", "8")]
    run = parse_megatron_lm([*mla, "--multi-latent-attention"], 16)
    assert run.arch.style.mla
    # _add_mla_args' defaults, not MLATransformerConfig's
    assert run.arch.config["kv_lora_rank"] == 32 and run.arch.config["qk_head_dim"] == 128
    assert not parse_megatron_lm(mla, 16).arch.style.mla


def test_context_parallelism_splits_the_sequence_and_shards_the_optimizer_over_dp_x_cp():
    from harness.plan.step import logits_bytes, resident_buffer_bytes
    from harness.plan.workload import workload_from_megatron_lm

    flags = [*DENSE, "--context-parallel-size", "2"]
    run = parse_megatron_lm(flags, 16)  # TP 2 x CP 2: DP 4
    workload = workload_from_megatron_lm(run)
    assert workload.data_parallel == 4 and workload.local_seq_length == 4096 // 2
    # MCore's DDP reduce-scatters dense gradients over its DP-CP group
    assert workload.optimizer_shards[0] == 4 * 2
    # logits of the rank's s / CP tokens, V / TP columns; bf16 and the fp32 copy
    elements = 4096 // 2 * 1 * run.vocab_size // 2
    assert logits_bytes(workload) == (elements * 2, elements * 4)
    # the data loader's mask, a CP rank's rows of it: [b, 1, s / CP, s] bools
    assert resident_buffer_bytes(workload) == 1 * (4096 // 2) * 4096
    with pytest.raises(UsageError, match="context parallelism with the unfused core attention"):
        parse_megatron_lm([*flags, "--attention-backend", "unfused"], 16)
    with pytest.raises(UsageError, match="allgather KV exchange .* is not modelled"):
        parse_megatron_lm([*flags, "--cp-comm-type", "allgather"], 16)


def test_distributed_optimizer_instances_shard_within_an_instance():
    from harness.plan.workload import workload_from_megatron_lm

    flags = [*DENSE, "--num-distributed-optimizer-instances", "2"]
    workload = workload_from_megatron_lm(parse_megatron_lm(flags, 16))
    assert workload.data_parallel == 8 and workload.optimizer_shards[0] == 8 // 2
    with pytest.raises(UsageError, match="does not divide data parallel 8"):
        parse_megatron_lm([*DENSE, "--num-distributed-optimizer-instances", "3"], 16)


def test_a_measuring_ranks_exception_is_reported_by_type_message_and_megatron_core_frame():
    # What plan shows when a layer measurement fails (the worker's report, not torchrun's banner).
    from megatron.core.transformer.transformer_config import TransformerConfig

    from harness.errors import exception_summary

    with pytest.raises(ValueError) as refused:  # the real validator: no such granularity
        TransformerConfig(
            num_layers=1, hidden_size=128, num_attention_heads=4, recompute_granularity="bogus"
        )
    reported = exception_summary(refused.value)
    assert reported["type"] == "ValueError"
    assert "recompute_granuarlity: bogus" in reported["message"]  # MCore's own spelling
    assert "\n" not in reported["message"]
    assert reported["where"].startswith("megatron/core/transformer/transformer_config.py:")


def test_an_uneven_pipeline_gives_its_first_and_last_stages_their_layers():
    from harness.plan.schedule import chunk_layers
    from harness.plan.workload import workload_from_megatron_lm

    flags = [*DENSE, "--pipeline-model-parallel-size", "4"]
    uneven = [*flags, "--decoder-first-pipeline-num-layers", "6"]
    run = parse_megatron_lm([*uneven, "--decoder-last-pipeline-num-layers", "8"], 32)
    # get_num_layers_to_build: 6 first, 8 last, the 18 between split over the two middle stages
    assert run.stage_layers == (6, 9, 9, 8)
    workload = workload_from_megatron_lm(run)
    assert chunk_layers(32, workload.parallelism, 1, workload.stage_layers) == [list(range(6, 15))]
    # only the first given: the other three stages share the rest
    assert parse_megatron_lm(uneven + ["--num-layers", "36"], 32).stage_layers == (6, 10, 10, 10)
    with pytest.raises(UsageError, match="do not split evenly over the 3 stage"):
        parse_megatron_lm(uneven + ["--num-layers", "35"], 32)
    with pytest.raises(UsageError, match="the stages' 6/9/9/9 layers do not split over 2 virtual"):
        vpp = ["--num-layers", "33", "--num-virtual-stages-per-pipeline-rank", "2"]
        parse_megatron_lm([*uneven, *vpp], 32)


def test_the_embedding_and_loss_counted_in_the_split_take_a_layer_from_the_end_virtual_stages():
    from harness.plan.schedule import chunk_layers
    from harness.plan.workload import workload_from_megatron_lm

    flags = [*DENSE, "--num-layers", "30", "--pipeline-model-parallel-size", "4"]
    flags += ["--num-virtual-stages-per-pipeline-rank", "2"]
    flags += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    run = parse_megatron_lm(flags, 32)
    # get_num_layers_to_build: (30 + 2) / PP 4 / 2 chunks = 4 a virtual stage, the first and the
    # last one fewer; layers in virtual-stage order (v = chunk x PP + rank)
    assert run.stage_layers == (3, 4, 4, 4, 4, 4, 4, 3)
    workload = workload_from_megatron_lm(run)
    assert chunk_layers(30, workload.parallelism, 0, workload.stage_layers) == [
        [0, 1, 2],
        [15, 16, 17, 18],
    ]
    assert "account_for_embedding_in_pipeline_split" not in run.arch.config


def test_deferred_embedding_wgrad_keeps_each_micro_batchs_output_layer_input_and_gradient():
    from harness.plan.step import _hidden_bytes, deferred_wgrad_bytes, logits_bytes
    from harness.plan.workload import workload_from_megatron_lm

    flags = [*DENSE, "--pipeline-model-parallel-size", "2", "--global-batch-size", "32"]
    plain = workload_from_megatron_lm(parse_megatron_lm(flags, 16))
    assert deferred_wgrad_bytes(plain, own=True) == 0
    run = parse_megatron_lm([*flags, "--defer-embedding-wgrad-compute"], 16)
    assert "defer_embedding_wgrad_compute" not in run.arch.config  # the stage's, not a layer's
    workload = workload_from_megatron_lm(run)
    # 32 / (1 x DP 4) = 8 micro-batches: at the last one's logits the 7 before it are held, each
    # its [s/tp, b, h] input and [s, b, V/tp] logits gradient in bf16
    each = _hidden_bytes(workload) + logits_bytes(workload)[0]
    assert workload.micro_batches == 8
    assert deferred_wgrad_bytes(workload, own=False) == 7 * each
    assert deferred_wgrad_bytes(workload, own=True) == 8 * each
    limited = parse_megatron_lm(
        [*flags, "--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", "3"], 16
    )
    assert deferred_wgrad_bytes(workload_from_megatron_lm(limited), own=True) == 3 * each
