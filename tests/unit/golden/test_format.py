"""Golden files: strict validation, exact CPU-probe goldens."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from record_samples import PROVENANCE, REVISIONS, refresh, run_record

from harness.errors import UsageError
from harness.golden.format import golden_from_records, validate_golden
from harness.golden.judge import compare_records
from harness.golden.store import load_golden
from harness.testing import check_against_golden


def test_golden_validation_refuses_nan_missing_pins_and_unruled_metrics(tmp_path):
    golden = golden_from_records([run_record()], PROVENANCE).to_json()
    bad = copy.deepcopy(golden)
    bad["rows"][0]["values"]["step_time_ms"] = float("nan")
    with pytest.raises(UsageError, match="finite number"):
        validate_golden(bad, "g")
    path = tmp_path / "g.json"
    path.write_text(
        json.dumps(golden).replace('"step_time_ms": 400.0', '"step_time_ms": Infinity', 1)
    )
    with pytest.raises(UsageError, match="Infinity"):
        load_golden(path)
    bad = copy.deepcopy(golden)
    bad["pins"]["megatron_core"] = {"version": None, "commit": None, "fingerprint": None}
    with pytest.raises(UsageError, match="must be pinned"):
        validate_golden(bad, "g")
    bad = copy.deepcopy(golden)
    del bad["tolerance"]["step_time_ms"]
    with pytest.raises(UsageError, match="no tolerance rule"):
        validate_golden(bad, "g")


def _probe(label: str, retained: int):
    from harness.config.fields import RecomputeFields
    from harness.record.build import (
        cpu_probe_metrics,
        hardware,
        new_record,
        outcome,
        parallelism,
        workload,
    )

    return new_record(
        "cpu-probe",
        revisions=REVISIONS,
        hardware=hardware("cpu", 0, host="h"),
        workload=workload(
            recipe="cpu-probe-gpt",
            model="tiny-gpt",
            backend="cpu-probe",
            seq_length=8,
            micro_batch_size=1,
            global_batch_size=1,
            precision="fp32",
            attention_backend="local",
            train_iters=None,
            parallelism=parallelism(),
        ),
        recompute=RecomputeFields.selective(label),
        metrics=cpu_probe_metrics(retained_bytes=retained, backward_flops=1000, replay_bytes=64),
        outcome=outcome("completed"),
    )


def test_cpu_probe_goldens_are_exact(tmp_path):
    assert refresh(tmp_path, _probe("core_attn", 4096), _probe("mlp", 8192)) == 0
    (golden,) = (tmp_path / "golden" / "cpu").glob("cpu-probe-gpt__cpux0__*.json")
    assert {rule["mode"] for rule in load_golden(golden).tolerance.values()} == {"exact"}
    check_against_golden([_probe("core_attn", 4096), _probe("mlp", 8192)], tmp_path / "golden")
    with pytest.raises(AssertionError, match=r"retained_bytes .* FAIL: changed"):
        check_against_golden([_probe("core_attn", 4097), _probe("mlp", 8192)], tmp_path / "golden")
    with pytest.raises(UsageError, match="kind"):
        compare_records(load_golden(golden), [run_record()], str(golden))


def _mutated(path: str, value):
    golden = golden_from_records(
        [run_record(), run_record("layernorm", step_ms=450.0)], PROVENANCE
    ).to_json()
    *parents, last = path.split(".")
    target: dict[str, Any] | list[Any] = golden
    for key in parents:  # a number indexes a list (rows.0), a name an object
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    elif value is KeyError:
        del target[last]
    else:
        target[last] = value
    return golden


@pytest.mark.parametrize(
    "path, value, problem",
    [
        ("kind", "banana", "not one of"),
        ("surprise", 1, "unknown key"),
        ("schema_version", True, "schema version"),
        ("hardware.gpu_count", -1, ">= 0"),
        ("rows.0.recompute", "garbage", "expected an object"),
        ("rows.0.values.step_time_ms", -5.0, ">= 0"),
        ("rows.0.outcome.phase", -1, "non-empty string"),
        ("rows.0.values", {}, "missing"),  # an empty row would turn any record set into PASS
        ("rows.0.values.step_time_ms", KeyError, "missing step_time_ms"),
        ("rows.0.label", "layernorm", "contradicts its recompute fields"),
        ("rows.1.values.bogus_metric", 1, "not a metric"),
    ],
)
def test_golden_loader_is_as_strict_as_the_record_loader(path, value, problem):
    with pytest.raises(UsageError, match=problem):
        validate_golden(_mutated(path, value), "g")


def test_the_same_configuration_twice_is_refused():
    golden = golden_from_records([run_record(), run_record("layernorm")], PROVENANCE).to_json()
    golden["rows"][1]["recompute"] = copy.deepcopy(golden["rows"][0]["recompute"])
    golden["rows"][1]["label"] = golden["rows"][0][
        "label"
    ]  # a label must name its fields: same fields, same label
    with pytest.raises(UsageError, match="duplicated row"):
        validate_golden(golden, "g")
