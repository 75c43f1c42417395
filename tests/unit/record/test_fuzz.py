"""Hypothesis fuzzing of the strict loaders: any input is a valid record set or one UsageError line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from record_samples import run_record

from harness.errors import UsageError
from harness.golden.format import validate_golden
from harness.golden.store import CHECKOUT_ROOT as GOLDEN_DIR
from harness.record.io import load_records, parse_json
from harness.record.model import validate_record

VALID = run_record("moe_act", record_id="fuzz").to_json()
GOLDEN = json.loads(next(GOLDEN_DIR.glob("nemotron*.json")).read_text())
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _mutate(document, path, value, delete):
    document = json.loads(json.dumps(document))
    if not path:
        return value
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return document


def _only_usage_error(check, document):
    try:
        check(document)
    except UsageError as exc:
        assert "\n" not in str(exc)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_load_or_fail_cleanly(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.json"
        path.write_bytes(data)
        _only_usage_error(lambda p: load_records([p]), path)


@given(st.integers(min_value=0, max_value=len(json.dumps(VALID)) - 1))
def test_every_truncation_is_refused(cut):
    try:
        validate_record(parse_json(json.dumps(VALID)[:cut], "r"))
    except UsageError:
        return
    raise AssertionError("a truncated record was accepted")


@given(st.sampled_from(list(_paths(VALID))), json_values, st.booleans())
def test_mutated_records_validate_or_fail_cleanly(path, value, delete):
    _only_usage_error(validate_record, _mutate(VALID, path, value, delete and bool(path)))


@given(st.sampled_from(list(_paths(GOLDEN))), json_values, st.booleans())
def test_mutated_goldens_validate_or_fail_cleanly(path, value, delete):
    _only_usage_error(
        lambda g: validate_golden(g, "g"), _mutate(GOLDEN, path, value, delete and bool(path))
    )
