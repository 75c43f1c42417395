"""The one-call golden check for tests (harness.testing) and the plugin fixture that wraps it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from record_samples import REVISIONS, refresh, run_record

from harness.golden.seed import DEFAULT_CARD, RECORDS_DIR, load_sources, transcribe
from harness.testing import check_against_golden


def test_check_against_golden_records_junit_properties_and_raises_with_the_table(tmp_path):
    assert refresh(tmp_path, run_record()) == 0
    properties: list[tuple[str, object]] = []
    check_against_golden(
        [run_record()], tmp_path / "golden", lambda k, v: properties.append((k, v))
    )
    recorded = dict(properties)
    assert str(recorded["golden.[].peak_allocated_bytes"]).startswith(
        "pass: golden=30.000 GB actual=30.000 GB"
    )
    assert str(recorded["golden.[].step_time_ms"]).startswith("pass: golden=400.00 actual=400.00")
    with pytest.raises(AssertionError, match=r"FAIL: regressed"):
        check_against_golden([run_record(step_ms=500.0)], tmp_path / "golden")
    bumped = copy.deepcopy(REVISIONS)
    bumped["torch"] = "2.15.0"
    with pytest.raises(AssertionError, match="no golden .* for these revision pins"):
        check_against_golden([run_record(revisions=bumped)], tmp_path / "golden")


def _card_study(card: Path, recipe: str = "moonlight-full-8gpu") -> list[dict]:
    """One card study as parsed JSON records (what ``json.load`` of a record file gives a test)."""
    return [record.to_json() for record in transcribe(card, load_sources(RECORDS_DIR))[recipe]]


def test_recompute_golden_fixture_judges_parsed_json_against_the_committed_golden(
    recompute_golden, tmp_path
):
    # The plugin's fixture (harness/pytest_plugin.py) as a foreign repo uses it, with records read from
    # the card afresh and the golden committed under tests/golden.
    comparison = recompute_golden.check(_card_study(DEFAULT_CARD))
    # the control: outcome + 7 absolute metrics; each of the 5 other rows: outcome + 3 effects + 2 counts
    assert comparison.passed and len(comparison.checks) == 8 + 5 * 6
    # One record object, as parsed, is judged too: the golden's other rows are then missing.
    with pytest.raises(AssertionError, match=r"\| core_attn \| row \| present \| missing \|"):
        recompute_golden.check(_card_study(DEFAULT_CARD)[0])
    card = yaml.safe_load(DEFAULT_CARD.read_text(encoding="utf-8"))
    card["measured_results"][0]["experiments"][0]["step_time_ms"] = 600.0  # card: 457.18
    mutated = tmp_path / "card.yaml"
    mutated.write_text(yaml.safe_dump(card), encoding="utf-8")
    # 600 / 457.18 = +31 % on the control, beyond its ±10 %
    with pytest.raises(AssertionError, match=r"\| \[\] \| step_time_ms \| 457.18 \| 600.00 \|"):
        recompute_golden.check(_card_study(mutated))


@pytest.mark.parametrize(
    ("records", "refusal"),
    [
        (
            42,
            r"^records: cannot judge a int; pass Record objects, record files or directories, or ",
        ),
        ([3.5], r"^records\[0\]: cannot judge a float; pass Record objects, record files"),
        ("missing.json", r"missing.json"),
        ([{"schema": "something else"}], r"^records\[0\]: "),
    ],
)
def test_check_says_in_one_line_what_it_cannot_take(recompute_golden, records, refusal):
    with pytest.raises(AssertionError, match=refusal) as refused:
        recompute_golden.check(records)
    assert "\n" not in str(refused.value)
