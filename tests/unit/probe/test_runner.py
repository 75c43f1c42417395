"""The CPU probe of the style models (computed once per module): goldens, statuses, bitwise verdicts,
attribution, carried memory and full recompute's method x recompute_num_layers."""

from __future__ import annotations

import json

import pytest

from harness.golden.probe import (
    check_probe_golden,
    golden_step,
    judge_probe_golden,
    probe_records,
    write_probe_golden,
)
from harness.golden.store import golden_filename
from harness.models import STYLE_MODELS, buildable_models
from harness.probe.present.coverage import describe_unmeasured
from harness.probe.present.table import (
    attribution_table,
    carried_table,
    grouped_attribution,
    probe_table,
)
from harness.probe.runner import probe_models

# Every test here reads one probe per style model (a module fixture, ~35 s of CPU): the whole plan of
# dense-tiny (its golden judged here too), and of the others the rows the tests read (the main job,
# .ci/run's step before this tier, judges their goldens).
pytestmark = pytest.mark.slow

# Labels implemented with MCore's CheckpointFunction (replay under the RNG tracker): bit-exact.
CHECKPOINT_LABELS = (
    "core_attn",
    "mlp",
    "moe",
    "shared_experts",
    "mla_up_proj",
    "full-uniform-1",
    "full-block-1",
)


WHOLE_PLAN_MODELS = ("dense-tiny", "mhc-tiny")
ROWS_READ = {
    "moonlight-tiny": [
        *("moe", "mla_up_proj", "layernorm", "moe_act", "mlp", "core_attn", "shared_experts"),
        *("full-uniform-1", "full-block-1", "full-uniform-3"),
    ],
    "dense-deep": [f"full-{method}-{n}" for method in ("uniform", "block") for n in range(1, 6)],
    "nemotron-tiny": ["mlp", "moe", "full-uniform-1", "full-uniform-2"],
}


@pytest.fixture(scope="module")
def probes():
    from harness.probe.plan import parse_label_sets, plan_rows

    assert any(
        row.may_hang for row in plan_rows(layers=2)
    )  # the deadlock row exists; probe/test_isolate.py runs it
    # mtp-tiny is judged by the main job, its own .ci/run step: the tests below read none of its rows.
    models = buildable_models()
    # probe/test_isolate.py runs the deadlock row
    whole = [name for name in models if name in WHOLE_PLAN_MODELS]
    results = probe_models(whole, hang_probe=False)
    for name, rows in ROWS_READ.items():
        results += probe_models([name], parse_label_sets(rows), hang_probe=False)
    return {probe.model: probe for probe in results}


def rows_of(probe):
    return {row.label: row for row in probe.rows if not row.add_bias_linear}


def test_cpu_goldens_match(probes):
    for probe in (probes[name] for name in WHOLE_PLAN_MODELS if name in probes):
        path, problems = check_probe_golden(probe)
        assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_golden_diff_is_readable_per_label(probes, tmp_path):
    probe = probes["moonlight-tiny"]
    path, written = write_probe_golden(probe, tmp_path)
    assert written
    golden = json.loads(path.read_text())
    row = next(row for row in golden["rows"] if row["label"] == "mla_up_proj")
    row["values"]["retained_bytes"] += 4096
    path.write_text(json.dumps(golden))
    _, problems = check_probe_golden(probe, tmp_path)
    assert problems[0].startswith("mla_up_proj: retained_bytes ")
    assert "FAIL" in problems[0] and len(problems) == 1


def test_rewriting_an_unchanged_golden_writes_nothing_and_lists_unmeasured_labels(probes, tmp_path):
    probe = probes["dense-tiny"]
    path, _ = write_probe_golden(probe, tmp_path)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    assert write_probe_golden(probe, tmp_path) == (path, False)  # only the date would have changed
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    golden = json.loads(path.read_text())
    unmeasured = {entry["label"]: entry for entry in golden["unmeasured"]}
    # dense-tiny has no MoE and no MLA: those labels are listed with why, never dropped.
    assert unmeasured["mla_up_proj"]["status"] == "rejected" and unmeasured["mla_up_proj"]["rule"]
    assert unmeasured["moe"]["status"] == "inactive"
    removed = golden["unmeasured"].pop(0)
    path.write_text(json.dumps(golden))
    _, problems = check_probe_golden(probe, tmp_path)
    assert problems == [f"{removed['label']}: unmeasured: {describe_unmeasured(removed)}"]


# The pins of a golden written by an older Megatron Core (pinned by version, no commit).
OLDER_MEGATRON_CORE = {"version": "0.0.1", "commit": None, "fingerprint": "0000000000000000"}


def test_after_a_revision_bump_the_diff_is_against_the_last_pinned_golden(probes, tmp_path):
    probe = probes["moonlight-tiny"]
    path, _ = write_probe_golden(probe, tmp_path)
    golden = json.loads(path.read_text())
    # As written by an older MCore, whether this one is pinned by a version or by a commit.
    golden["pins"]["megatron_core"] = OLDER_MEGATRON_CORE
    next(row for row in golden["rows"] if row["label"] == "moe")["values"]["backward_flops"] += 1
    older = path.with_name(golden_filename(golden["recipe"], golden["hardware"], golden["pins"]))
    older.write_text(json.dumps(golden))
    path.unlink()
    judged = judge_probe_golden(probe, tmp_path)
    # Judged against the older golden, named once, with the one changed value as its problem.
    assert judged.against == older and judged.against_words == "megatron-core 0.0.1 (00000000…)"
    (problem,) = judged.problems
    assert problem.startswith("moe: backward_flops ") and "FAIL" in problem
    (change,) = judged.changes
    assert (change.label, change.metric, change.after - change.before) == (
        "moe",
        "backward_flops",
        -1,
    )


def test_a_new_revision_with_no_value_changed_is_same_behaviour(probes, tmp_path):
    probe = probes["dense-tiny"]
    path, _ = write_probe_golden(probe, tmp_path)
    golden = json.loads(path.read_text())
    golden["pins"]["megatron_core"] = OLDER_MEGATRON_CORE
    older = path.with_name(golden_filename(golden["recipe"], golden["hardware"], golden["pins"]))
    older.write_text(json.dumps(golden))
    path.unlink()
    judged = judge_probe_golden(probe, tmp_path)
    assert (judged.path, judged.problems, judged.same_as) == (path, (), older)
    step = golden_step([probe], write=False, golden_dir=tmp_path)
    expected = (
        f"dense-tiny: same behaviour: no golden {path.name} for this new revision, and no value "
        f"changed against {older.name}"
    )
    assert not step.differs and step.lines() == [expected]


def test_rows_survive_the_isolated_childs_json(probes):
    from harness.probe.runner import ProbeRowResult

    for row in probes["moonlight-tiny"].rows:
        assert ProbeRowResult.from_dict(json.loads(json.dumps(row.as_dict()))) == row


def test_records_are_cpu_probe_run_records(probes):
    records = probe_records(probes["dense-tiny"])
    assert {record.kind for record in records} == {"cpu-probe"}
    assert all(record.workload.backend == "cpu-probe" for record in records)
    assert records[0].recompute.modules == ()


def test_checkpoint_labels_are_bitwise_equal_with_and_without_dropout(probes):
    for probe in probes.values():
        for label, row in rows_of(probe).items():
            if label in CHECKPOINT_LABELS and row.measured:
                assert row.equivalence.bitwise and row.dropout_equivalence.bitwise, (
                    probe.model,
                    label,
                )


def test_labels_that_do_nothing_are_reported_inactive(probes):
    assert rows_of(probes["dense-tiny"])["moe"].status == "inactive"  # no MoE layers
    assert rows_of(probes["dense-tiny"])["shared_experts"].status == "inactive"
    assert rows_of(probes["nemotron-tiny"])["mlp"].status == "inactive"  # every MLP is MoE
    assert rows_of(probes["moonlight-tiny"])["mlp"].status == "effective"  # first layer is dense


def test_moe_act_is_measured_in_te_grouped_mlp_on_the_adapters_stand_ins(probes):
    # Without TE the experts are still MCore's TEGroupedMLP (its linears the CPU adapter's
    # grouped-linear stand-ins): moe_act frees the activation outputs linear_fc2 saved, bitwise.
    row = rows_of(probes["moonlight-tiny"])["moe_act"]
    control = probes["moonlight-tiny"].control
    assert row.status == "effective" and row.retained_bytes < control.retained_bytes
    assert row.equivalence is not None and row.equivalence.bitwise


def test_rejections_carry_the_matrix_rule(probes):
    row = rows_of(probes["dense-tiny"])["mla_up_proj"]
    assert row.status == "rejected" and row.rule and row.rule != "mcore.unclassified"
    assert "multi_latent_attention" in row.reason


def test_output_discard_boundaries_count_as_freed(probes):
    # layernorm and mla_up_proj discard their outputs after forward (storage resized to 0):
    # the modules' retained bytes must drop to zero, not be counted at save time.
    control = grouped_attribution(probes["moonlight-tiny"].control.attribution)
    layernorm = grouped_attribution(rows_of(probes["moonlight-tiny"])["layernorm"].attribution)
    norms = [m for m in control if m.endswith(("input_layernorm", "pre_mlp_layernorm"))]
    assert norms and all(control[m] > 0 and layernorm.get(m, 0) == 0 for m in norms)
    up_proj = grouped_attribution(rows_of(probes["moonlight-tiny"])["mla_up_proj"].attribution)
    kv_up = [m for m in control if m.endswith("linear_kv_up_proj")]
    assert kv_up and all(up_proj.get(m, 0) == 0 for m in kv_up)


def test_full_recompute_retains_least_and_replays_most(probes):
    for probe in probes.values():
        rows = [row for row in rows_of(probe).values() if row.measured]
        # One uniform chunk of every layer keeps only the block's input.
        full = rows_of(probe)[f"full-uniform-{STYLE_MODELS[probe.model].layers}"]
        assert full.retained_bytes == min(row.retained_bytes for row in rows)
        assert full.backward_flops == max(row.backward_flops for row in rows)
        assert probe.control.replay_bytes == 0 and full.replay_bytes > 0


def test_tables_render(probes):
    table = probe_table(probes["moonlight-tiny"])
    assert "| `[]` |" in table and "| `mla_up_proj` |" in table and "| `moe_act` |" in table
    assert "linear_kv_up_proj" in attribution_table(probes["moonlight-tiny"])


def test_carried_memory_names_the_moe_dispatcher_under_reentrant_recompute(probes):
    # docs/carried-memory.md: under `moe` and full recompute the dispatcher's routing probabilities
    # (allgather: local_probs, moonlight-tiny; alltoall: probs, nemotron-tiny) hold the replay's
    # graph, keeping the checkpoint input and its grad ([s, b, h] each) alive.
    for name, attribute in (("moonlight-tiny", "local_probs"), ("nemotron-tiny", "probs")):
        probe, rows = probes[name], rows_of(probes[name])
        hidden = [probe.seq_length, probe.micro_batch_size, 64]
        for label in ("moe", "full-uniform-1"):
            extra = rows[label].carried_bytes - probe.control.carried_bytes
            leaves = [
                h
                for h in rows[label].carried_holders
                if h["holder"].endswith(
                    (f".{attribute} -> graph leaf", f".{attribute} -> graph leaf .grad")
                )
            ]
            assert (
                list(leaves[0]["shape"]) == hidden and len(leaves) == 2 * 2
            )  # two MoE layers in each model
            assert extra == sum(h["nbytes"] for h in leaves) > 0
        assert not any("graph leaf" in h["holder"] for h in probe.control.carried_holders)
    dense = rows_of(probes["dense-tiny"])
    assert dense["full-uniform-1"].carried_bytes == probes["dense-tiny"].control.carried_bytes
    assert "local_probs -> graph leaf" in carried_table(probes["moonlight-tiny"])


def test_uniform_and_block_differ_by_recompute_num_layers_on_a_four_layer_model(probes):
    rows = rows_of(probes["dense-deep"])
    retained = {label: row.retained_bytes for label, row in rows.items() if row.measured}
    # uniform keeps one checkpointed input per chunk: 4, 2 and 1 chunks of 4 layers.
    assert retained["full-uniform-1"] > retained["full-uniform-2"] > retained["full-uniform-4"]
    # 3 does not divide 4: chunks of 3 and 1 layers keep as many inputs as two chunks of 2.
    assert retained["full-uniform-3"] == retained["full-uniform-2"]
    # block checkpoints the first n layers and keeps every activation of the rest.
    assert (
        retained["full-block-1"]
        > retained["full-block-2"]
        > retained["full-block-3"]
        > retained["full-block-4"]
    )
    # Each block layer replays its whole forward in backward: replayed bytes grow with n.
    replayed = [rows[f"full-block-{n}"].replay_bytes for n in (1, 2, 3, 4)]
    assert replayed == sorted(replayed) and len(set(replayed)) == 4


def test_a_count_above_the_layers_is_a_result_not_a_skip(probes):
    # recompute_num_layers 5 on 4 layers: the validator does not bound it, so the row is measured
    # or says what the revision did (rejected / error with the exception), and the golden keeps it.
    for method in ("uniform", "block"):
        row = rows_of(probes["dense-deep"])[f"full-{method}-5"]
        assert row.measured or (row.status in ("rejected", "error") and row.reason)
