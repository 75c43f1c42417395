"""The compatibility matrix: complete, well-formed, every validator rule reachable, and in agreement
with the real validator (Hypothesis differential test)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcore_checkout import copy_sources

from harness.cli import main
from harness.config.rule import UNCLASSIFIED, VALIDATOR
from harness.config.rules import RULES, RULES_BY_ID, rule_for_message
from harness.config.validate import validate
from harness.matrix.check import check, compare, minimize
from harness.matrix.drift import (
    RULES_FILE,
    dead_rules,
    fields_named,
    grouped_disagreements,
    labels_without_rules,
)
from harness.matrix.oracle import Oracle
from harness.matrix.space import (
    MAX_LABELS,
    UNKNOWN_LABELS,
    Scenario,
    dimensions,
    options_of,
    sample_scenarios,
)

ORACLE = Oracle()

# The skill's "Compatibility and Validation" constraints and the list, by rule id.
REQUIRED_RULES = {
    "cuda-graph.full-recompute-needs-full-iteration",  # full + non-full-iteration CUDA graphs
    "ep-overlap.no-moe-recompute",  # whole moe + expert-parallel overlap
    "labels.shared_experts-vs-shared-expert-overlap",
    "fp8.delayed-scaling-vs-output-discard",  # FP8 delayed scaling + moe_act/layernorm
    "fp8.output-discard-needs-te",
    "recompute.distribute-saved-activations-vs-sequence-parallel",
    "offload.no-recompute",
    "offload.no-pipeline-parallel",
    "labels.mla_up_proj-needs-mla",
    "labels.moe_act-needs-grouped-gemm",
    "labels.gdn_norm_out-needs-gdn",
    "cuda-graph.graphed-attention-recompute-vs-dropout",
    "cuda-graph.graphed-mlp-recompute-vs-dropout",
    "cuda-graph.graphed-moe-recompute-vs-input-jitter",
    "cuda-graph.moe-recompute-straddles-router-graph",  # checkpoint straddling a graph boundary
    "labels.unknown",
    "semantics.selective-empty-is-control",
    "semantics.full-supersedes-selective",
    "semantics.mlp-on-moe-layers",
    "bridge.ep-overlap-vs-moe-recompute",
}


def test_matrix_covers_the_required_constraints():
    assert REQUIRED_RULES <= set(RULES_BY_ID)
    assert len(RULES_BY_ID) == len(RULES), "rule ids must be unique"


def test_rules_are_well_formed():
    for rule in RULES:
        assert rule.outcome in ("accept", "reject", "warn", "silently-ignored", "hang"), rule.id
        assert rule.reads and rule.condition and rule.source, rule.id
        if rule.differential:
            assert rule.enforced_in == VALIDATOR, rule.id
            assert (rule.message is not None) == (rule.outcome in ("reject", "warn")), rule.id
            assert (rule.raises is not None) == (rule.outcome == "reject"), rule.id
            assert rule.outcome in ("reject", "warn") or rule.rewrite is not None, rule.id
    assert rule_for_message("something MCore has never said") == UNCLASSIFIED


@functools.cache
def dead_in_this_revision() -> frozenset[str]:
    """The rules that cannot fire on the installed MCore (read from its sources once, when a test asks)."""
    return frozenset(dead.rule for dead in dead_rules())


@pytest.mark.parametrize(
    "rule_id", [rule.id for rule in RULES if rule.message and rule.differential]
)
def test_every_validator_rule_can_still_fire(rule_id):
    # One test per rule: a bump that removes or rewords some checks fails once for each, by rule id.
    assert rule_id not in dead_in_this_revision(), next(
        dead.report() for dead in dead_rules() if dead.rule == rule_id
    )


def test_every_validator_rule_is_reachable_and_recognized():
    examples: dict[str, Scenario] = {}
    for scenario in sample_scenarios(20_000, ORACLE.labels, seed=7):
        prediction = ORACLE.predict(scenario.fields())
        for rule in (prediction.rule, *prediction.warning_rules):
            examples.setdefault(rule, scenario)
    # A rule that can no longer fire fails test_every_validator_rule_can_still_fire (once, by name).
    unreached = (
        {rule.id for rule in RULES if rule.message and rule.differential}
        - set(examples)
        - dead_in_this_revision()
        - set(DEEP_RULES)
    )
    assert not unreached, f"the configuration space never reaches {sorted(unreached)}"
    for rule_id, scenario in examples.items():
        if rule_id is None:
            continue
        verdict = validate(scenario.fields())
        if verdict.rule == UNCLASSIFIED:
            continue  # a message no rule knows: test_every_validator_message_is_classified names it
        assert rule_id in (verdict.rule, *verdict.warning_rules), (
            rule_id,
            scenario.describe(),
            verdict,
        )
        if verdict.rule == rule_id:
            assert verdict.mcore_exception == RULES_BY_ID[rule_id].raises


# Rules behind so many prerequisites that the seeded sample meets them too rarely to rely on (about
# once in 10^5): each is reached by a config made of the space's own options instead.
DEEP_RULES = {
    "cuda-graph.gtp-shared-experts-recompute-under-low-precision": (
        {
            "model": "moe-shared-experts",
            "cuda_graph": "local-moe_router",
            "recompute_granularity": "'selective'",
            "fp4+gtp_weight_remat_size": "fp4='e2m1', gtp_weight_remat_size=2",
        },
        ("shared_experts",),
    ),
}


@pytest.mark.parametrize("rule_id", sorted(DEEP_RULES))
def test_every_deep_rule_is_reached_by_the_options_of_the_space(rule_id):
    chosen, modules = DEEP_RULES[rule_id]
    if rule_id in dead_in_this_revision() or not set(chosen) <= set(dimensions()):
        pytest.skip(
            f"{rule_id}: this revision has no such check (the space derives no option for it)"
        )
    options = tuple(
        (dimension, chosen.get(dimension, baseline))
        for dimension, baseline in Scenario.baseline().options
    )
    scenario = Scenario(options, modules)
    assert ORACLE.predict(scenario.fields()).rule == rule_id
    assert validate(scenario.fields()).rule == rule_id


def _option(dimension: str) -> st.SearchStrategy[tuple[str, str]]:
    baseline, common, rare = options_of(dimension)
    # Baseline first: Hypothesis shrinks toward it, so a failure reports only the dimensions that matter.
    choices = [st.just(baseline)] + [st.sampled_from(group) for group in (common, rare) if group]
    return st.one_of(choices).map(lambda option: (dimension, option))


scenarios = st.builds(
    Scenario,
    options=st.tuples(*(_option(dimension) for dimension in dimensions())),
    modules=st.none()
    | st.lists(
        st.sampled_from(sorted(ORACLE.labels) + list(UNKNOWN_LABELS)), max_size=MAX_LABELS
    ).map(tuple),
)


@given(scenarios)
def test_matrix_predicts_the_real_validator(scenario):
    disagreement = compare(ORACLE, scenario)
    assert disagreement is None, "\n" + minimize(ORACLE, disagreement).report()


def test_check_reports_a_wrong_matrix_with_a_minimal_config():
    blind_to_mlp = Oracle(labels=ORACLE.labels - {"mlp"})
    disagreements = check(sample_scenarios(400, ORACLE.labels, seed=1), blind_to_mlp)
    assert disagreements
    report = disagreements[0].report()
    assert "'mlp'" in report and "matrix predicts: reject [labels.unknown]" in report
    assert "MCore validator: accept" in report


def test_matrix_command_prints_every_rule(capsys):
    assert main(["matrix"]) == 0
    table = capsys.readouterr().out
    assert all(f"`{rule.id}`" in table for rule in RULES)


def test_matrix_check_command(capsys):
    # No drift on the stack under test: were there any, the tests above would fail first, each naming
    # its kind (a rule that can no longer fire, a label no rule names, a disagreement).
    assert main(["matrix", "--check", "--count", "300"]) == 0
    out = capsys.readouterr().out
    assert "checked 300 configurations against megatron-core " in out
    assert (
        "0 disagreements (0 causes), 0 rules that can no longer fire, 0 labels no rule names" in out
    )
    assert main(["matrix", "--check", "--count", "0"]) == 2
    assert capsys.readouterr().err == "recompute-harness: error: --count must be positive\n"


def test_a_removed_validator_check_is_a_rule_that_can_no_longer_fire(tmp_path):
    from harness.config.revisions import megatron_core_root

    root, copy = megatron_core_root(), tmp_path / "core"
    copy_sources(root, copy)
    config = copy / "transformer" / "transformer_config.py"
    text = config.read_text()
    assert "mla_up_proj in recompute_modules is only supported with" in text
    config.write_text(
        text.replace("mla_up_proj in recompute_modules is only supported with", "(reworded)")
    )
    # Named once, next to whatever this revision already lacks (reported by the test above).
    assert [dead.rule for dead in dead_rules(copy) if dead.rule not in dead_in_this_revision()] == [
        "labels.mla_up_proj-needs-mla"
    ]


def test_disagreements_are_grouped_by_cause_with_one_minimal_config():
    blind_to_mlp = Oracle(labels=ORACLE.labels - {"mlp"})
    causes = grouped_disagreements(sample_scenarios(400, ORACLE.labels, seed=1), blind_to_mlp)
    (cause,) = [cause for cause in causes if cause.key == ("verdict", "labels.unknown", "accept")]
    assert cause.count > 1  # many sampled configs, one entry
    assert cause.example.scenario.modules == ("mlp",) and cause.example.scenario.describe() == (
        "recompute_granularity='selective', recompute_modules=['mlp']"
    )
    assert "matrix says labels.unknown, MCore says accept" in cause.report()


def test_an_unknown_validator_message_names_its_fields_and_the_file_to_edit():
    assert fields_named("'x' in recompute_modules requires moe_grouped_gemm=True and fp8") == [
        "recompute_modules",
        "moe_grouped_gemm",
        "fp8",
    ]
    assert labels_without_rules({"harness_new_label"}) == ["harness_new_label"]


@pytest.mark.parametrize("label", sorted(ORACLE.labels))
def test_every_accepted_label_is_named_by_a_rule(label):
    # One test per label: a bump that adds labels the matrix does not know fails once for each.
    assert label not in labels_without_rules(ORACLE.labels), (
        f"no rule in {RULES_FILE} names {label!r}"
    )


def test_every_validator_message_is_classified():
    causes = grouped_disagreements(sample_scenarios(2_000, ORACLE.labels, seed=7), ORACLE)
    unclassified = [cause.report() for cause in causes if cause.key[0] == "unclassified"]
    assert not unclassified, "\n".join(unclassified)
