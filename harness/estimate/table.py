"""The estimate as markdown (the JSON is ``Estimate.as_dict()``)."""

from __future__ import annotations

from harness.estimate.estimate import Estimate

MB = 1e6  # decimal, as the skill card's GB/MB figures


def _mb(value: int | None) -> str:
    return "—" if value is None else f"{value / MB:,.1f}"


def estimate_table(estimate: Estimate, *, attribution: int = 3) -> str:
    layout = estimate.parallelism
    layers = ", ".join(f"{count} {kind}" for kind, count in estimate.layers.items())
    lines = [
        f"## estimate: {estimate.recipe} ({estimate.model})",
        (
            f"hot rank {estimate.hot_rank} of TP{layout['tp']} PP{layout['pp']} EP{layout['ep']} ETP{layout['etp']}"
            f"{' SP' if layout['sequence_parallel'] else ''}; seq {estimate.seq_length}, micro-batch "
            f"{estimate.micro_batch_size}, {estimate.precision}, {estimate.attention_backend} core attention; "
            f"{layers} layers on the hot stage, {estimate.in_flight_microbatches} micro-batch(es) in flight; "
            f"measured at seq {', '.join(map(str, estimate.probe_seq_lengths))} and extrapolated"
        ),
        f"scope: {estimate.scope}",
        "",
        "| Row | Retained MB | Saving vs `[]` MB | Saving % | Peak saving MB (peak in) | Status | Per kind saving MB | Largest removals (MB) |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for row in estimate.rows:
        saving = row.saving_bytes if row.saving_bytes is not None else row.partial_saving_bytes
        saving_text = _mb(saving) + (
            " (partial)" if row.saving_bytes is None and saving is not None else ""
        )
        pct = "—" if row.saving_pct is None else f"{row.saving_pct:.2f}"
        kinds = (
            ", ".join(f"{kind} {_mb(part['saving_bytes'])}" for kind, part in row.per_kind.items())
            or "—"
        )
        removed = (
            "; ".join(
                f"{item['module']} {_mb(item['bytes'])}"
                for item in row.removed[:attribution]
                if item["bytes"] > 0
            )
            or "—"
        )
        status = row.status + (f": {row.reason}" if row.reason else "")
        peak = (
            "—"
            if row.peak_saving_bytes is None
            else f"{_mb(row.peak_saving_bytes)} ({row.peak_phase})"
        )
        lines.append(
            f"| `{row.label}` | {_mb(row.retained_bytes)} | {saving_text} | {pct} | {peak} | {status} | {kinds} | {removed} |"
        )
    return "\n".join(lines)
