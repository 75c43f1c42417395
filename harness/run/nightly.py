"""What the nightly GPU tier compares, in one place: tests/gpu/test_gpu_runner.py runs these cases,
``ci/nightly-gpu.sh --list`` and ``ci/golden-refresh.sh --list`` print them (``CASE GOLDEN``), the
refresh's default recipes are theirs, and docs/ci.md describes them.

A case is a recipe run whole, its records landing where ci/nightly-gpu.sh compares them, judged
against the golden of the installed stack's exact pins (recipe × hardware × revisions). A stack with
no such golden fails the case in one line that names it, the pins and the refresh command. A seed
study (its golden transcribed from the skill card, pinned to the card's revisions) is judged on its
pins' golden where one exists, and otherwise on *effects*: each row against the matched ``[]``
control of the same night, against the card's effects (``harness.golden.judge.compare_effects``).

    python -m harness.run.nightly list       # CASE GOLDEN, one a line ('-': no golden for these pins)
    python -m harness.run.nightly recipes    # the recipes, one a line (golden-refresh.sh's default)
    python -m harness.run.nightly golden RECORDS   # how ci/nightly-gpu.sh judges a sweep's records:
        # "exact PATH" or "effects PATH"; exit 1 with the one line that names what is missing
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.revisions import collect_revisions
from harness.errors import UsageError
from harness.golden.format import Golden, pins_differences
from harness.golden.seed import PROVENANCE_SOURCE
from harness.golden.store import golden_root, goldens_of
from harness.record.io import load_records
from harness.record.model import Revisions
from harness.run.recipes import load_recipe

REFRESH = "ci/golden-refresh.sh"


@dataclass(frozen=True)
class NightlyCase:
    """One compared sweep of the nightly: its recipe and what the runner needs to run it
    (tests/support/gates.py ``require`` keywords)."""

    recipe: str
    needs: dict[str, Any] = field(default_factory=dict)
    # Its golden is the skill card's study: judged on effects where the stack's pins differ.
    seed_study: bool = False


NIGHTLY_CASES: tuple[NightlyCase, ...] = (
    NightlyCase("mcore-moonlight-1gpu", {"gpus": 1}),
    NightlyCase("mcore-moonlight-2gpu", {"gpus": 2}),
    NightlyCase("moonlight-short-8gpu", {"gpus": 8, "te": True, "bridge": True}),
    NightlyCase(
        "nemotron-3-nano-short-8gpu", {"gpus": 8, "te": True, "mamba": True, "bridge": True}
    ),
    NightlyCase("moonlight-full-8gpu", {"gpus": 8, "sm": "9.0", "te": True, "bridge": True}, True),
)


def nightly_case(recipe: str) -> NightlyCase:
    (case,) = [case for case in NIGHTLY_CASES if case.recipe == recipe]
    return case


def installed_pins() -> dict[str, Any]:
    """The pins of the stack this process imports: what a golden of tonight's records must state."""
    return Revisions.from_json(collect_revisions()).pins()


def hardware_of(recipe: str) -> dict[str, Any]:
    """The hardware profile a case's golden is written for (the recipe's target GPUs)."""
    loaded = load_recipe(recipe)
    return {"device": loaded.hardware or "unidentified", "gpu_count": loaded.world_size}


def golden_for(
    case: NightlyCase, pins: dict[str, Any], root: Path | None = None
) -> tuple[Path, Golden] | None:
    """The golden of ``case`` pinned to exactly ``pins``; None when none is."""
    candidates = goldens_of(case.recipe, hardware_of(case.recipe), golden_root(root))
    exact = [(path, golden) for path, golden in candidates if not pins_differences(golden, pins)]
    return exact[0] if exact else None


def seed_golden(case: NightlyCase, root: Path | None = None) -> tuple[Path, Golden] | None:
    """A seed study's card golden (transcribed from the skill card), whatever its pins."""
    candidates = goldens_of(case.recipe, hardware_of(case.recipe), golden_root(root))
    seeds = [(p, g) for p, g in candidates if g.provenance.get("source") == PROVENANCE_SOURCE]
    return seeds[0] if seeds else None


def describe_pins(pins: dict[str, Any]) -> str:
    """``megatron-core 0.19.2 (commit …|fingerprint …), megatron-bridge 0.6.2, torch …, TE …, CUDA …``."""
    core = pins.get("megatron_core") or {}
    core_pin = core.get("commit") or core.get("fingerprint")
    bridge = pins.get("megatron_bridge") or {}
    parts = [
        f"megatron-core {core.get('version')}" + (f" ({str(core_pin)[:16]})" if core_pin else ""),
        f"megatron-bridge {bridge.get('commit', '')[:12] or bridge.get('version')}"
        if bridge
        else "no megatron-bridge",
        f"torch {pins.get('torch')}",
        f"transformer-engine {pins.get('transformer_engine')}",
        f"CUDA {pins.get('cuda')}",
    ]
    return ", ".join(parts)


def missing_golden_line(case: NightlyCase, pins: dict[str, Any]) -> str:
    """The one line a night without a golden for ``case`` fails with."""
    return (
        f"{case.recipe}: no golden for the installed stack ({describe_pins(pins)}); "
        f"write one on this runner with: {REFRESH} {case.recipe}"
    )


def listing(root: Path | None = None) -> list[str]:
    """``CASE GOLDEN`` for every case (``-`` where no golden is pinned to the installed stack)."""
    pins = installed_pins()
    lines = []
    for case in NIGHTLY_CASES:
        found = golden_for(case, pins, root)
        lines.append(f"{case.recipe} {found[0] if found is not None else '-'}")
    return lines


def judgement(records_dir: Path, root: Path | None = None) -> tuple[str, str]:
    """How a sweep's records are judged: ``("exact", golden)``, ``("effects", card golden)`` for a
    seed study on other pins, or ``("missing", the line naming the case, pins and refresh)``."""
    records = load_records([records_dir])
    recipe = records[0].workload.recipe
    known = [case for case in NIGHTLY_CASES if case.recipe == recipe]
    case = known[0] if known else NightlyCase(recipe)
    pins = records[0].pins()
    found = golden_for(case, pins, root)
    if found is not None:
        return "exact", str(found[0])
    seed = seed_golden(case, root) if case.seed_study else None
    if seed is not None:
        return "effects", str(seed[0])
    return "missing", missing_golden_line(case, pins)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "golden":
        how, what = judgement(Path(argv[1]))
        print(what if how == "missing" else f"{how} {what}")
        return 1 if how == "missing" else 0
    if argv == ["list"]:
        print("\n".join(listing()))
        return 0
    if argv == ["recipes"]:
        print("\n".join(case.recipe for case in NIGHTLY_CASES))
        return 0
    print("usage: python -m harness.run.nightly list|recipes|golden RECORDS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as exc:
        print(f"nightly: {exc}", file=sys.stderr)
        sys.exit(2)
