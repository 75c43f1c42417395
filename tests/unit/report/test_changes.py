"""Changed probe values on one screen (harness.report.changes): what became of each label, collapsed
across models and precisions, with the figures behind it; the first changed value is a value."""

from __future__ import annotations

from harness.record.changes import MEASURED, STATUS, UNMEASURED, ValueChange
from harness.record.metrics import MetricName
from harness.report.changes import fate, first_change, label_lines


def _inactive(model: str, where: str, replayed: int, retained: int) -> list[ValueChange]:
    """core_attn's row in one pass of a tree where it stopped recomputing: replays nothing, and
    retains what [] retains (+6 % on what it retained)."""
    return [
        ValueChange(
            model, where, "core_attn", MetricName.RETAINED_BYTES, retained, retained * 106 // 100
        ),
        ValueChange(model, where, "core_attn", MetricName.REPLAY_BYTES, replayed, 0),
        ValueChange(model, where, "core_attn", STATUS, "effective", "inactive"),
    ]


def test_a_label_that_stopped_recomputing_is_one_line_over_every_model_and_precision():
    changes = [
        *_inactive("dense-tiny", "dense-tiny", 2_565_644, 773_448),
        *_inactive("dense-tiny", "dense-tiny (bf16)", 1_700_000, 500_000),
        *_inactive("dense-deep", "dense-deep", 5_131_288, 1_462_608),
    ]
    # Two models (three passes): the precisions fold into the models.
    assert label_lines(changes, 6) == [
        "core_attn: inactive on 2 models (replayed 1.7 to 5.1 MB -> 0, retained +6 %)"
    ]
    first = first_change(changes)
    assert first is not None
    assert first.line() == "dense-tiny: core_attn: retained_bytes 773448 -> 819854"


def test_what_became_of_a_row_reads_from_its_values_when_its_status_held():
    def change(metric: str, before: int, after: int) -> ValueChange:
        return ValueChange("m", "m", "mlp+core_attn", metric, before, after)

    # Replays less and retains more: the label set saves less and costs less.
    assert (
        fate(
            [
                change(MetricName.RETAINED_BYTES, 445_768, 494_912),
                change(MetricName.REPLAY_BYTES, 3_417_612, 851_968),
            ]
        )
        == "saves less, costs less"
    )
    assert fate([change(MetricName.BACKWARD_FLOPS, 10, 12)]) == "costs more"
    assert fate([change(MetricName.NOT_BITWISE_VALUES, 0, 3)]) == "no longer bitwise"
    assert fate([change(MetricName.PEAK_BACKWARD_BYTES, 10, 12)]) == "peaks moved"
    # A status says more than the values it explains.
    assert fate([ValueChange("m", "m", "moe", STATUS, "effective", "error")]) == "now fails (error)"
    assert (
        fate([ValueChange("m", "m", "moe_act", UNMEASURED, "requires-TE: ...", MEASURED)])
        == "now measured"
    )


def test_the_lines_stop_at_the_limit_and_count_the_rest():
    changes = [
        ValueChange("m", "m", f"label{i}", MetricName.RETAINED_BYTES, 100, 90) for i in range(9)
    ]
    lines = label_lines(changes, 4)
    assert len(lines) == 4
    assert lines[:3] == [f"label{i}: saves more on m (retained -10 %)" for i in range(3)]
    assert lines[3] == "6 more label(s) changed: every value is in the report"


def test_labels_changed_on_more_passes_come_first_and_single_labels_before_sets():
    changes = [
        ValueChange("a", "a", "mlp+core_attn", MetricName.REPLAY_BYTES, 10, 20),
        ValueChange("a", "a", "mlp", MetricName.REPLAY_BYTES, 10, 20),
        ValueChange("a", "a", "layernorm", MetricName.REPLAY_BYTES, 10, 20),
        ValueChange("b", "b", "layernorm", MetricName.REPLAY_BYTES, 10, 20),
    ]
    assert [line.split(":")[0] for line in label_lines(changes, 6)] == [
        "layernorm",
        "mlp",
        "mlp+core_attn",
    ]
