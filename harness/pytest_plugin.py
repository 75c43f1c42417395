"""pytest plugin (entry point ``pytest11``): golden checks of recompute runs in any repo's test suite.

Installed with the harness, it is active in every pytest run of that environment:

- registers the ``gpu`` and ``slow`` markers, so ``--strict-markers`` works in a repo that never
  declared them;
- ``--recompute-golden-dir DIR`` (else ``$RECOMPUTE_HARNESS_GOLDEN_DIR``, else the default golden root of
  ``harness.record.golden_dir``);
- ``--recompute-regen``: write the goldens instead of judging them; the test then fails saying what it
  wrote, as pytest-regressions' ``--force-regen`` does, so a regenerated golden is never a silent pass;
- fixture ``recompute_golden``: ``recompute_golden.check(records)`` takes records (``Record`` objects,
  or record files / directories) and judges them against the golden of their recipe × hardware ×
  revision pins, with one JUnit property per metric; it fails with the comparison table, or with the
  refusal naming the pins that differ.

Only this module and ``harness.record.golden_dir``'s constants load at pytest start-up; the comparator is
imported by the fixture, so the plugin costs a foreign test run next to nothing until it is used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

GOLDEN_DIR_OPTION = "--recompute-golden-dir"
REGEN_OPTION = "--recompute-regen"
# harness.record.golden_dir reads it; named here (for --help) so start-up imports nothing of the harness.
ENV_VAR = "RECOMPUTE_HARNESS_GOLDEN_DIR"
MARKERS = (
    "gpu: needs a CUDA GPU (nightly H100 tier); skipped with a reason that names what is missing",
    "slow: a CPU test that launches processes (torchrun); still part of the CPU tier",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("recompute-harness", "recompute-harness golden checks")
    group.addoption(
        GOLDEN_DIR_OPTION,
        metavar="DIR",
        default=None,
        help=f"golden root for recompute_golden (default: ${ENV_VAR}, else the harness's own)",
    )
    group.addoption(
        REGEN_OPTION,
        action="store_true",
        default=False,
        help="write the goldens from the checked records instead of judging them (the test fails, saying so)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)


class GoldenCheck:
    """What the ``recompute_golden`` fixture returns."""

    def __init__(
        self, root: str | None, regen: bool, record_property: Callable[[str, object], None]
    ) -> None:
        self._root = root
        self._regen = regen
        self._record_property = record_property

    @property
    def root(self) -> Path:
        from harness.errors import UsageError
        from harness.record.golden_dir import golden_root

        try:
            return golden_root(self._root)
        except UsageError as refused:
            raise pytest.UsageError(str(refused)) from None

    def check(self, records: Sequence[object], golden: Path | str | None = None) -> object:
        """Judge ``records`` (Records or record paths) against their golden under the root, or ``golden``
        (a file or a directory). Returns the ``Comparison``; raises ``AssertionError`` when it fails."""
        from harness.errors import UsageError
        from harness.record.io import load_records
        from harness.record.model import Record
        from harness.testing import check_against_golden

        try:
            loaded = [r for r in records if isinstance(r, Record)]
            paths = [r for r in records if not isinstance(r, Record)]
            loaded += load_records(paths) if paths else []
        except UsageError as refused:
            raise AssertionError(str(refused)) from None
        target = self.root if golden is None else Path(golden)
        if self._regen:
            pytest.fail(self._regenerate(loaded, target), pytrace=False)
        return check_against_golden(loaded, target, self._record_property)

    @staticmethod
    def _regenerate(records: list, root: Path) -> str:
        from harness.errors import UsageError
        from harness.record.golden_dir import writable
        from harness.record.refresh import plan_refresh, write_refresh

        if root.is_file():
            root = root.parent.parent if root.parent.name == "cpu" else root.parent
        try:
            plans = plan_refresh(records, writable(root), f"pytest {REGEN_OPTION}", True, True)
            write_refresh(plans)
        except UsageError as refused:
            return f"{REGEN_OPTION}: {refused}"
        return (
            f"{REGEN_OPTION}: wrote "
            + ", ".join(str(plan.path) for plan in plans)
            + "; rerun without it to judge"
        )


@pytest.fixture
def recompute_golden(
    request: pytest.FixtureRequest, record_property: Callable[[str, object], None]
) -> GoldenCheck:
    """``recompute_golden.check(records)``: judge run records against the golden of their pins."""
    config = request.config
    # None falls through to golden_root's own order ($RECOMPUTE_HARNESS_GOLDEN_DIR, then the default).
    return GoldenCheck(
        config.getoption(GOLDEN_DIR_OPTION), bool(config.getoption(REGEN_OPTION)), record_property
    )
