"""The environment is part of what a run golden is pinned to (issue 36, item 5): a record that ran with
another environment is refused as another workload, never compared as if equal; goldens and records
written before environments were recorded still load, and are judged without one, saying so."""

from __future__ import annotations

import json

import pytest
from record_samples import run_record

from harness.errors import UsageError
from harness.golden.format import golden_from_records, identity_differences
from harness.golden.judge import compare_records
from harness.golden.seed import RECORDS_DIR
from harness.golden.store import CHECKOUT_ROOT, load_golden
from harness.record.io import load_records

PROVENANCE = {"source": "test: records of this file"}
# The nightly's declared environment on a NeMo image, and what Bridge's Moonlight recipe adds.
LAUNCHED = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
WITH_BRIDGE = {**LAUNCHED, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def _sweep(environment):
    return [run_record(environment=environment), run_record("moe_act", environment=environment)]


def test_a_golden_keeps_the_environment_of_its_records():
    golden = golden_from_records(_sweep(WITH_BRIDGE), PROVENANCE)
    assert golden.environment == WITH_BRIDGE
    assert golden.to_json()["environment"] == WITH_BRIDGE


def test_a_record_with_another_environment_is_refused_naming_the_variable():
    # The leak of defect 3: a row that inherited Bridge's allocator setting without its golden having it.
    golden = golden_from_records(_sweep(LAUNCHED), PROVENANCE)
    leaked = _sweep(WITH_BRIDGE)
    assert identity_differences(golden, leaked[0]) == [
        "environment.PYTORCH_CUDA_ALLOC_CONF <unset> != expandable_segments:True"
    ]
    with pytest.raises(
        UsageError, match=r"refusing to compare .*environment\.PYTORCH_CUDA_ALLOC_CONF"
    ):
        compare_records(golden, leaked, "golden.json")


def test_records_of_two_environments_make_no_golden():
    with pytest.raises(UsageError, match="environment"):
        golden_from_records([run_record(environment=LAUNCHED), run_record("moe_act")], PROVENANCE)


def test_a_golden_without_an_environment_judges_records_with_one_and_says_it_did_not():
    golden = golden_from_records(_sweep(None), PROVENANCE)
    assert golden.environment is None and "environment" not in golden.to_json()
    comparison = compare_records(golden, _sweep(WITH_BRIDGE), "golden.json")
    assert comparison.passed
    (note,) = [check for check in comparison.checks if check.metric == "environment"]
    assert note.tolerance == "not judged: the golden predates environment records"


def test_goldens_and_records_on_disk_load_without_an_environment():
    # The seed goldens predate environment records; goldens written since (a GPU check's) hold one.
    goldens = {path: load_golden(path) for path in sorted(CHECKOUT_ROOT.glob("*.json"))}
    older = [path for path in goldens if "environment" not in json.loads(path.read_text())]
    assert older and all(goldens[path].environment is None for path in older)
    records = load_records(sorted(RECORDS_DIR.glob("seed-*.json")))
    assert records and all(record.workload.environment is None for record in records)


def test_a_record_without_an_environment_cannot_match_a_golden_that_pins_one():
    golden = golden_from_records(_sweep(LAUNCHED), PROVENANCE)
    assert identity_differences(golden, run_record()) == [
        "environment: the golden pins one, the record kept none (written before environments)"
    ]
