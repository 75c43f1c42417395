"""``plan``'s renderers: the table of rows (peak per rank, fit, cost, the chosen row) and the plot of
peak against cost with the budget line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.files import atomic_path

GB = 1e9


def _gb(value: int | None) -> str:
    return "—" if value is None else f"{value / GB:.2f}"


def plan_table(plan: dict[str, Any]) -> str:
    """Markdown: one line per row, the chosen row marked, then what the model cannot see."""
    budget = plan["budget_bytes"]
    title = (
        f"plan {plan['workload']}: budget {_gb(budget)} GB per GPU, margin "
        f"{plan['margin'] * 100:.0f} %, layout {_layout(plan['parallelism'])}"
    )
    header = (
        "| row | status | peak (GB) | cost (% step FLOPs) | peak at (rank, iteration, phase, module) "
        "| params / grads / optimizer / activations / temporaries + workspace + buffers (GB) "
        "| source |"
    )
    lines = [title, "", header, "|---|---|---:|---:|---|---|---|"]
    for row in plan["rows"]:
        mark = " ← chosen" if row["label"] == plan["chosen"] else ""
        hot = max(row["per_rank"], key=lambda r: r["peak_bytes"]) if row["per_rank"] else None
        where = parts = ""
        if hot is not None:
            where = f"{hot['ranks'][0]}: it {hot['iteration']}, {hot['phase']}, {hot['module']}"
            p = hot["parts"]
            parts = (
                " / ".join(
                    _gb(p.get(k, 0))
                    for k in ("parameters", "gradients", "optimizer_state", "activations")
                )
                + f" / {_gb(sum(p.get(k, 0) for k in ('temporaries', 'workspace', 'buffers')))}"
            )
        status = row["status"]
        if row.get("oom"):
            oom = row["oom"]
            status = f"OOM (rank {oom['ranks'][0]}, it {oom['iteration']}, {oom['phase']})"
        if row.get("rule"):
            status = f"rejected [{row['rule']}]"
        cost = "—" if row["cost_share"] is None else f"{row['cost_share'] * 100:.2f}"
        lines.append(
            f"| `{row['label']}`{mark} | {status} | {_gb(row['peak_bytes'])} | {cost} | {where} "
            f"| {parts} | {row['source']} |"
        )
    lines += ["", f"chosen: {plan['chosen'] or 'none fits'}", "not seen (assumed):"]
    lines += [f"  {what}: {size}" for what, size in plan["unseen"].items()]
    if plan.get("ignored_flags"):
        lines.append(f"ignored flags (no effect on memory): {' '.join(plan['ignored_flags'])}")
    return "\n".join(lines)


def _layout(p: dict[str, Any]) -> str:
    vpp = f" VPP{p['vpp']}" if p.get("vpp") else ""
    return (
        f"{p['world_size']} GPUs, TP{p['tp']} PP{p['pp']}{vpp} CP{p['cp']} EP{p['ep']} "
        f"DP{p['dp']} (expert DP {p['expert_dp']}), {p['micro_batches']} micro-batches"
    )


def plot_plan(plan: dict[str, Any], path: Path) -> None:
    """Peak against cost, one point per predicted row, the budget as a line; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 5))
    for row in plan["rows"]:
        if row["peak_bytes"] is None:
            continue
        x, y = row["cost_share"] * 100, row["peak_bytes"] / GB
        axes.scatter([x], [y], color="tab:green" if row["fits"] else "tab:red")
        axes.annotate(row["label"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes.axhline(plan["budget_bytes"] / GB, color="black", linestyle="--", label="budget")
    axes.set_xlabel("replayed share of the step's FLOPs (%)")
    axes.set_ylabel("predicted peak allocated per GPU (GB)")
    axes.set_title(f"plan {plan['workload']}: chosen {plan['chosen'] or 'none'}")
    axes.legend()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=120)
    pyplot.close(figure)
