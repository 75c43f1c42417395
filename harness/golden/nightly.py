"""What the nightly GPU tier compares, in one place: ``tests/gpu``, ``ci/nightly-gpu.sh``,
``ci/golden-refresh.sh`` and docs/runner.md all read ``NIGHTLY_CASES``.

A case is a recipe whose full row set the nightly runs and compares with the golden of the installed
stack's exact pins (``golden_for``). A card study (``seed``) without such a golden is compared by its
effects with the card's own golden instead (``harness.golden.judge.compare_effects``). A case with
neither fails the night, in one line naming the case, the pins and the refresh command.

``recompute-harness nightly list|recipes|check|compare RECORDS`` prints them (harness.commands.nightly).

The installed pins are read from the running stack (``collect_revisions``), never typed; the golden
root follows ``$RECOMPUTE_HARNESS_GOLDEN_DIR`` like every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.golden.format import Golden, describe_pins, pins_differences
from harness.golden.judge import Comparison, compare_effects, compare_records
from harness.golden.store import goldens_of, load_golden, resolve_golden
from harness.record.io import load_records
from harness.record.model import Record, Revisions
from harness.record.vocabulary import RecordKind
from harness.run.recipes import Recipe, load_recipe

# The nightly runners' GPU (the profile every GPU golden of the tier is written on).
NIGHTLY_DEVICE = "H100_80GB"


@dataclass(frozen=True)
class NightlyCase:
    recipe: str
    # A skill-card study: across revisions its effects are judged against the card's golden.
    seed: bool = False

    @cached_property
    def loaded(self) -> Recipe:
        return load_recipe(self.recipe)

    @property
    def hardware(self) -> dict[str, Any]:
        return {"device": NIGHTLY_DEVICE, "gpu_count": self.loaded.world_size}


NIGHTLY_CASES: tuple[NightlyCase, ...] = (
    NightlyCase("mcore-moonlight-1gpu"),
    NightlyCase("mcore-moonlight-2gpu"),
    NightlyCase("moonlight-short-8gpu"),
    NightlyCase("nemotron-3-nano-short-8gpu"),
    NightlyCase("moonlight-full-8gpu", seed=True),
)


@dataclass(frozen=True)
class CaseGolden:
    """The golden a case is compared with for one stack; ``path`` None: there is none yet."""

    case: NightlyCase
    path: Path | None
    golden: Golden | None
    effect_only: bool

    def missing_line(self, installed: dict[str, Any]) -> str:
        return (
            f"no golden for {self.case.recipe} on {NIGHTLY_DEVICE}x{self.case.hardware['gpu_count']} "
            f"pinned to the installed stack ({describe_pins(installed)}): write it on the GPU runner "
            f"with ci/golden-refresh.sh {self.case.recipe}"
        )


def installed_pins() -> dict[str, Any]:
    return Revisions.from_json(collect_revisions()).pins()


def case_named(recipe: str) -> NightlyCase | None:
    return next((case for case in NIGHTLY_CASES if case.recipe == recipe), None)


def golden_for(case: NightlyCase, installed: dict[str, Any], root: Path) -> CaseGolden:
    """The golden of ``case`` whose pins the installed stack matches; for a seed case without one, the
    card's reference golden (effect-only); else none."""
    candidates = goldens_of(case.recipe, case.hardware, root) if root.is_dir() else []
    exact = [
        (path, golden) for path, golden in candidates if not pins_differences(golden, installed)
    ]
    if len(exact) > 1:
        raise UsageError(
            f"{len(exact)} goldens of {case.recipe} match the installed pins: "
            f"{', '.join(path.name for path, _ in exact)}"
        )
    if exact:
        return CaseGolden(case, exact[0][0], exact[0][1], effect_only=False)
    references = [(p, g) for p, g in candidates if g.kind == RecordKind.REFERENCE]
    if case.seed and references:
        path, golden = max(references, key=lambda found: (found[1].date, found[0].name))
        return CaseGolden(case, path, golden, effect_only=True)
    return CaseGolden(case, None, None, effect_only=False)


def judge(case_golden: CaseGolden, records: list[Record]) -> Comparison:
    """The night's comparison of one case's records with its golden (``UsageError``: there is none)."""
    found, path = case_golden.golden, case_golden.path
    if found is None or path is None:
        raise UsageError(case_golden.missing_line(records[0].pins() if records else {}))
    if case_golden.effect_only:
        return compare_effects(found, records, str(path))
    return compare_records(found, records, str(path))


def compare_sweep(records_dir: Path, root: Path) -> Comparison:
    """One sweep's records against the golden the nightly compares them with: a case's (its exact pins,
    or a seed study's card golden by effects); a recipe that is no case, the golden its pins name."""
    records = load_records([records_dir])
    if not records:
        raise UsageError(f"{records_dir}: no records")
    case = case_named(records[0].workload.recipe)
    if case is not None:
        return judge(golden_for(case, records[0].pins(), root), records)
    path = resolve_golden(records, root)
    if not path.is_file():
        raise UsageError(f"no golden {path.name} in {path.parent} for {records_dir}")
    return compare_records(load_golden(path), records, str(path))
