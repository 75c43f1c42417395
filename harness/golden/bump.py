"""After a Megatron Core bump, the CPU half of a golden refresh (``bump``).

Steps, each timed: the identity of the imported Megatron Core; the label diff against the pinned (or
newest) manifest, then the manifest for this revision; the matrix drift report; one probe (its
passes on ``--jobs`` workers) that prints the per-label diff and writes the CPU goldens. Every write
is idempotent (an unchanged revision writes nothing, byte for byte). A step that cannot run says
why, and the summary lists what was refreshed, what was left and the next step.
``ci/golden-refresh.sh`` runs this, then the GPU half.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.config.revisions import collect_revisions, megatron_core_identity
from harness.cpu.adapter import drifted_objects
from harness.errors import UsageError
from harness.golden.labels import manifest_verdict, write_manifest
from harness.golden.probe import adapter_drift_lines, golden_step, refuse_unpinnable
from harness.matrix.drift import RULES_FILE, SPACE_FILE, drift_report
from harness.models import buildable_models, not_probed_lines
from harness.probe.plan import PRECISIONS
from harness.probe.present.table import probe_table, unmeasured_table
from harness.probe.workers.passes import probe_passes
from harness.record.changes import ValueChange


@dataclass
class BumpSummary:
    """What a bump refreshed, left and measured, and the next step."""

    refreshed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)
    # What the probe found changed against the goldens it replaces (the previous revision's).
    changes: list[ValueChange] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"refreshed: {len(self.refreshed)}",
            *(f"  {item}" for item in self.refreshed),
            f"left: {len(self.left)}",
            *(f"  {item}" for item in self.left),
        ]
        steps = self.next_steps or ["review the diffs above and commit tests/golden/"]
        out += ["next step:", *(f"  {step}" for step in steps)]
        out.append(
            "wall time: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.timings)
        )
        return out


def _step(summary: BumpSummary, name: str, action: Callable[[], None]) -> None:
    print(f"\n== {name}", flush=True)
    started = time.perf_counter()
    try:
        action()
    finally:
        summary.timings.append((name, time.perf_counter() - started))


def bump(
    count: int, *, jobs: int, probe: bool = True, golden_dir: Path | None = None
) -> BumpSummary:
    """Run the bump's steps, printing each as it runs (the probe's passes on ``jobs`` workers); the
    caller has refused an MCore without an identity and unwritable golden directories (nothing is
    written then)."""
    summary = BumpSummary()

    def identity() -> None:
        mcore, found = collect_revisions()["megatron_core"], megatron_core_identity()
        print(
            f"megatron-core {mcore['version']} commit {mcore['commit'] or '-'} fingerprint {mcore['fingerprint']} "
            f"imported from {found['root']}"
        )
        for note in found["notes"]:
            print(f"note: {note}")

    def labels() -> None:
        print(manifest_verdict(golden_dir)[0])
        path, written = write_manifest(golden_dir)
        print(f"{'wrote' if written else 'unchanged'} {path}")
        summary.refreshed += [str(path)] if written else []

    def matrix() -> None:
        lines, drifted, _ = drift_report(count)
        print("\n".join(lines))
        if drifted:
            summary.left.append("compatibility matrix: drift reported above")
            summary.next_steps.append(
                f"edit {RULES_FILE} (and {SPACE_FILE} for new fields) as the matrix "
                "report says, then rerun ci/golden-refresh.sh"
            )

    def probe_step() -> None:
        try:
            drift = refuse_unpinnable(write=True, golden_dir=golden_dir)
        except UsageError as exc:
            print(f"refused: {exc}")
            summary.left.append("CPU goldens: the probe refused to write (see above)")
            summary.next_steps.append(
                "make the CPU adapter pass its self-check on this revision "
                "(harness/cpu/self_check.py says what failed), then rerun ci/golden-refresh.sh"
            )
            return
        try:
            probes = probe_passes(buildable_models(), PRECISIONS, jobs=jobs)
        except RuntimeError as exc:  # a pass worker died or hung (and was killed): nothing written
            print(f"failed: {exc}")
            summary.left.append("CPU goldens: a probe pass failed (see above)")
            return
        for result in probes:
            print(probe_table(result) + "\n")
        unmeasured = unmeasured_table(probes)
        if unmeasured:
            print(unmeasured + "\n")
        for line in not_probed_lines():
            print(line)
        step = golden_step(probes, write=True, golden_dir=golden_dir, adapter_drift=drift)
        print("\n".join(adapter_drift_lines(drift) + step.lines()))
        summary.refreshed += step.written
        summary.changes += [change for verdict in step.verdicts for change in verdict.changes]

    _step(summary, "identity", identity)
    _step(summary, "labels", labels)
    _step(summary, "matrix", matrix)
    if not probe:
        drifted = drifted_objects()
        print(
            "\nCPU adapter: "
            + (
                f"replaced objects changed since review: {', '.join(drifted)}"
                if drifted
                else "its replaced objects match their review"
            )
            + " (its self-check runs with the probe)"
        )
        summary.left.append("CPU goldens (--no-probe)")
    else:
        _step(summary, "probe", probe_step)
    return summary
