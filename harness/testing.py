"""One-call golden check for tests, in the spirit of pytest-regressions' ``check()``::

    def test_probe_matches_golden(record_property):
        check_against_golden(records, golden_root(), record_property)

``golden`` is a golden file, or a directory (``harness.record.golden_dir``) in which the golden named by
the records' recipe × hardware × revision pins is looked up — so a Megatron Core bump fails with the refresh command
instead of comparing against another revision's numbers. Failures raise ``AssertionError`` carrying
the markdown table; ``record_property`` (pytest's fixture) gets one JUnit property per metric.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from harness.compare.comparator import Comparison, compare_records, missing_golden_message
from harness.errors import UsageError
from harness.record.golden import load_golden
from harness.record.golden_dir import resolve_golden
from harness.record.model import Record
from harness.report.junit import record_golden_properties
from harness.report.markdown import comparison_markdown


def check_against_golden(
    records: Sequence[Record],
    golden: Path,
    record_property: Callable[[str, object], None] | None = None,
) -> Comparison:
    """Compare validated ``records`` with their golden; raise ``AssertionError`` unless every check passes."""
    if not records:
        raise AssertionError("no records to check against a golden")
    path = resolve_golden(records, golden)
    if not path.is_file():
        raise AssertionError(missing_golden_message(records, path))
    try:
        comparison = compare_records(load_golden(path), records, str(path))
    except (
        UsageError
    ) as refused:  # pins differ from the named file: a test failure, not bad CLI input
        raise AssertionError(str(refused)) from None
    if record_property is not None:
        record_golden_properties(comparison, record_property)
    if not comparison.passed:
        raise AssertionError(comparison_markdown(comparison))
    return comparison
