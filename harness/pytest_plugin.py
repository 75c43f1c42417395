"""pytest plugin (entry point ``pytest11``): golden checks of recompute runs in any repo's test suite.

Installed with the harness, it is active in every pytest run of that environment:

- registers the ``gpu`` and ``slow`` markers, so ``--strict-markers`` works in a repo that never
  declared them;
- ``--recompute-golden-dir DIR`` (else ``$RECOMPUTE_HARNESS_GOLDEN_DIR``, else the default golden root of
  ``harness.golden.store``);
- ``--recompute-regen``: write the goldens instead of judging them; the test then fails saying what it
  wrote, as pytest-regressions' ``--force-regen`` does, so a regenerated golden is never a silent pass;
- fixture ``recompute_golden``: ``recompute_golden.check(records)`` takes records (``Record`` objects,
  record files / directories, or records as parsed JSON) and judges them against the golden of their
  recipe × hardware × revision pins (``harness.testing``), with one JUnit property per metric, without
  a warning in any junit_family; it fails with the comparison table, with the refusal naming the pins
  that differ, or with one line saying what it cannot take.

It wires pytest to ``harness.testing`` and nothing else. Importing it costs a foreign pytest run about
25 ms beyond pytest itself (``python -X importtime``; no torch, no Megatron Core).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.golden.judge import Comparison
from harness.golden.store import ENV_VAR, golden_root
from harness.testing import RecordsLike, check_against_golden, regenerate_golden

GOLDEN_DIR_OPTION = "--recompute-golden-dir"
REGEN_OPTION = "--recompute-regen"
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
        try:
            return golden_root(self._root)
        except UsageError as refused:
            raise pytest.UsageError(str(refused)) from None

    def check(
        self,
        records: Iterable[RecordsLike] | Mapping[str, object],
        golden: Path | str | None = None,
    ) -> Comparison:
        """Judge ``records`` (Records, record paths, or records as parsed JSON) against their golden
        under the root, or ``golden`` (a file or a directory). Returns the ``Comparison``; raises
        ``AssertionError`` when it fails or when ``records`` are not records (one line)."""
        target = self.root if golden is None else Path(golden)
        if self._regen:
            try:
                written = regenerate_golden(records, target, f"pytest {REGEN_OPTION}")
            except UsageError as refused:
                pytest.fail(f"{REGEN_OPTION}: {refused}", pytrace=False)
            pytest.fail(
                f"{REGEN_OPTION}: wrote {', '.join(map(str, written))}; rerun without it to judge",
                pytrace=False,
            )
        return check_against_golden(records, target, self._record_property)


@pytest.fixture
def recompute_golden(request: pytest.FixtureRequest) -> GoldenCheck:
    """``recompute_golden.check(records)``: judge run records against the golden of their pins."""
    config = request.config

    def record_property(name: str, value: object) -> None:
        # What pytest's ``record_property`` does, without requesting it: that fixture warns under
        # the default junit_family (xunit2), whose schema has no per-test properties, yet pytest
        # writes them in every family and CI readers show them. (``record_testsuite_property``, the
        # xunit2 alternative, is lost in pytest-xdist workers.)
        request.node.user_properties.append((name, value))

    # None falls through to golden_root's own order ($RECOMPUTE_HARNESS_GOLDEN_DIR, then the default).
    return GoldenCheck(
        config.getoption(GOLDEN_DIR_OPTION), bool(config.getoption(REGEN_OPTION)), record_property
    )
