"""Transcribe the skill card's ``measured_results`` into reference records and goldens.

    python -m harness.golden.seed [--card harness/data/reference/card.yaml] [--mcore-tree MEGATRON_LM_CHECKOUT]

Every number comes from the card; this module only maps the card's field names onto the run record.
The card pins Megatron Core by commit only. ``--mcore-tree`` (a clean git work tree at a card commit)
derives that commit's version and recompute-source fingerprint with ``harness.config.revisions`` and
keeps them in ``mcore-sources.json`` beside the records, so later runs reproduce the pins without the
tree; a golden pinned by commit and version + fingerprint is then judged wherever the same recompute
sources are installed (a wheel carries no commit; Bridge's submodule does).
Derived figures the card also states (``*_vs_control_pct``) are not copied: the analysis recomputes
them, and the tests check it agrees with the card. Output is deterministic (the record date is the
card's ``validated_on``), so re-running the script on an unchanged card reproduces the committed files.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.config.fields import RecomputeFields
from harness.config.revisions import tree_identity
from harness.errors import EXIT_USAGE, UsageError
from harness.files import write_json_atomic
from harness.golden.format import golden_from_records
from harness.golden.store import golden_path_for, golden_root, writable, write_golden
from harness.record.build import new_record, outcome, parallelism, workload
from harness.record.io import read_json
from harness.record.metrics import MetricName
from harness.record.model import (
    Hardware,
    Headline,
    Outcome,
    ParallelLayout,
    Record,
    RunMetrics,
    SteadyWindow,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CARD = REPO / "harness" / "data" / "reference" / "card.yaml"
RECORDS_DIR = REPO / "harness" / "data" / "reference"
PROVENANCE_SOURCE = "transcribed from the skill card"
# Card study -> the harness recipe that reproduces it (harness/data/recipes/), or a descriptive name
# for a historical study the harness does not rerun.
STUDY_RECIPES = {
    "Moonlight 16B": "moonlight-full-8gpu",
    "Nemotron 3 Nano": "nemotron-3-nano-full-16gpu",
    "Llama3 70B": "llama3-70b-sft-pr3107",
}
# Every study on the card ran through Megatron Bridge recipes (the card is Bridge's skill card).
BACKEND = "bridge"
GB = 1e9  # the card's GB are decimal
SOURCES_FILE = "mcore-sources.json"  # {commit: {version, fingerprint}} derived from source trees
SOURCES_SCHEMA = "recompute-harness/mcore-sources"

_PARALLEL_RE = re.compile(r"(TP|PP|CP|EP|DP|VPP)(\d+)")
_WINDOW_RE = re.compile(r"iterations (\d+)-(\d+)")
_AFTER_RE = re.compile(r"after iteration (\d+)")
# Whose peak each study's numbers are. Nemotron's card says "rank-0 reported peak"; Moonlight's peaks are
# Bridge's memory report, which Megatron prints on data-parallel rank 0 (the hottest of those ranks).
STUDY_PEAK_SCOPES = {"Moonlight 16B": "dp-rank0", "Nemotron 3 Nano": "rank0"}
_WORKLOAD_EXTRA = ("task", "architecture", "execution", "measurement", "golden_tflops")


def _parallelism(study: dict[str, Any]) -> ParallelLayout:
    stated = {name.lower(): int(size) for name, size in _PARALLEL_RE.findall(study["parallelism"])}
    # The card's layout strings omit unused dimensions (size 1); vpp/expert_dp stay null when unstated.
    return parallelism(
        tp=stated.get("tp", 1),
        pp=stated.get("pp", 1),
        cp=stated.get("cp", 1),
        ep=stated.get("ep", 1),
        dp=stated.get("dp", 1),
        expert_dp=study.get("expert_data_parallel_size"),
        vpp=stated.get("vpp"),
    )


def _outcome(row: dict[str, Any], study: dict[str, Any]) -> Outcome:
    status = row.get("status")
    if status is None:  # a study whose rows all completed its stated steps (Moonlight)
        return outcome(
            "completed", iteration=study.get("steps"), message="card: all rows completed"
        )
    message = f"card status: {status}"
    if match := re.fullmatch(r"completed_(\d+)_steps", status):
        return outcome("completed", iteration=int(match[1]), message=message)
    if match := re.fullmatch(r"OOM_iteration_(\d+)_(\w+)", status):
        return outcome("oom", iteration=int(match[1]), message=message, site=match[2])
    if match := re.fullmatch(r"OOM_on_rank(\d+)", status):
        return outcome("oom", ranks=[int(match[1])], message=message)
    if status == "perf_regression":  # it measured steady throughput, so the run completed
        return outcome("completed", message=message)
    raise UsageError(
        f"card row {row['name']!r}: unknown status {status!r}; teach harness/golden/seed.py its meaning"
    )


def _metrics(row: dict[str, Any], study: dict[str, Any], status: str) -> RunMetrics:
    measurement = study.get("measurement", "")
    peak_gb, after = row.get("peak_mem_gb"), None
    for key, value in row.items():
        if match := re.fullmatch(r"peak_mem_gb_after_iteration_(\d+)", key):
            peak_gb, after = value, int(match[1])
    if after is None and peak_gb is not None and (match := _AFTER_RE.search(measurement)):
        after = int(match[1])
    window = _WINDOW_RE.search(measurement)
    sanity = study.get("numerical_sanity", "")
    # "zero skipped and NaN iterations" is stated for the rows that ran their steps.
    clean = 0 if status == "completed" and "zero skipped" in sanity else None
    step_time = row.get(MetricName.STEP_TIME_MS)
    return RunMetrics(
        iterations=[],
        ranks=[],
        steady_window=SteadyWindow(int(window[1]), int(window[2]))
        if window and step_time is not None
        else None,
        headline=Headline(
            values={
                MetricName.PEAK_ALLOCATED_BYTES: None if peak_gb is None else round(peak_gb * GB),
                MetricName.PEAK_RESERVED_BYTES: None,
                MetricName.PEAK_AFTER_ITERATION: after,
                MetricName.STEP_TIME_MS: step_time,
                MetricName.TFLOPS_PER_GPU: row.get(MetricName.TFLOPS_PER_GPU, row.get("tflops")),
            },
            peak_rank=0 if "rank-0" in measurement and peak_gb is not None else None,
            peak_scope=STUDY_PEAK_SCOPES.get(study["model"], "unreported"),
        ),
        skipped_iterations=clean,
        nan_iterations=clean,
    )


def load_sources(records_dir: Path) -> dict[str, dict[str, str]]:
    """``{commit: {version, fingerprint}}`` derived so far (empty when none was)."""
    path = records_dir / SOURCES_FILE
    if not path.is_file():
        return {}
    data = read_json(path)
    if (
        not isinstance(data, dict)
        or data.get("schema") != SOURCES_SCHEMA
        or not isinstance(data.get("sources"), dict)
    ):
        raise UsageError(f"{path}: not a {SOURCES_SCHEMA} file; re-derive it with --mcore-tree")
    return data["sources"]


def derive_sources(
    card_path: Path, records_dir: Path, trees: list[Path]
) -> dict[str, dict[str, str]]:
    """Add the identity of each tree (which must be at a commit the card pins) to ``mcore-sources.json``."""
    sources = load_sources(records_dir)
    if not trees:
        return sources
    pinned = {
        (study.get("revisions") or {}).get("megatron_core")
        for study in _card(card_path)["measured_results"]
    }
    for tree in trees:
        identity = tree_identity(tree)
        if identity["commit"] not in pinned:
            raise UsageError(
                f"{tree} is at commit {identity['commit']}, which no card study pins "
                f"(pinned: {', '.join(sorted(c for c in pinned if c))})"
            )
        sources[identity["commit"]] = {
            "version": identity["version"],
            "fingerprint": identity["fingerprint"],
        }
    write_json_atomic(
        records_dir / SOURCES_FILE,
        {
            "schema": SOURCES_SCHEMA,
            "schema_version": 1,
            "derived_by": "python -m harness.golden.seed --mcore-tree CHECKOUT (harness.config.revisions.tree_identity)",
            "sources": dict(sorted(sources.items())),
        },
    )
    return sources


def _revisions(study: dict[str, Any], sources: dict[str, dict[str, str]]) -> dict[str, Any]:
    pins = study.get("revisions") or {}
    commit = pins.get("megatron_core")
    derived = sources.get(commit, {}) if commit is not None else {}
    return {
        "torch": None,
        "megatron_core": {
            "version": derived.get("version"),
            "commit": commit,
            "fingerprint": derived.get("fingerprint"),
        },
        "megatron_bridge": {"version": None, "commit": pins["bridge"]}
        if pins.get("bridge")
        else None,
        "transformer_engine": None,
        "cuda": None,
        "driver": None,
        "python": None,
    }


def transcribe_study(
    study: dict[str, Any],
    card_path: str,
    validated_on: str,
    sources: dict[str, dict[str, str]] | None = None,
) -> list[Record]:
    """One reference record per experiment row of a ``measured_results`` study."""
    recipe = STUDY_RECIPES.get(study["model"])
    if recipe is None:
        raise UsageError(
            f"card study {study['model']!r} has no recipe name in harness/golden/seed.py STUDY_RECIPES"
        )
    extra = {key: str(study[key]).strip() for key in _WORKLOAD_EXTRA if key in study}
    notes = study.get("comparison_limitations")
    records = []
    for row in study["experiments"]:
        row_outcome = _outcome(row, study)
        records.append(
            new_record(
                "reference",
                record_id=f"reference/{recipe}/{row['name']}",
                created=validated_on,
                revisions=_revisions(study, sources or {}),
                hardware=Hardware(study["gpu"], study["gpus"], sm=None, host=None),
                workload=workload(
                    recipe=recipe,
                    model=study["model"],
                    backend=BACKEND,
                    seq_length=study["seq_length"],
                    micro_batch_size=study["mbs"],
                    global_batch_size=study["gbs"],
                    precision=study["precision"],
                    attention_backend=None,
                    train_iters=study.get("steps"),
                    parallelism=_parallelism(study),
                    extra=extra,
                ),
                recompute=RecomputeFields.selective(*row["recompute_modules"]),
                metrics=_metrics(row, study, row_outcome.status),
                outcome=row_outcome,
                provenance={
                    "source": PROVENANCE_SOURCE,
                    "card": card_path,
                    "study": study["model"],
                    "row": row["name"],
                    "date": validated_on,
                    "notes": None if notes is None else " ".join(notes.split()),
                },
            )
        )
    return records


def _card(card_path: Path) -> dict[str, Any]:
    try:
        return yaml.safe_load(Path(card_path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{card_path}: cannot read the skill card: {exc}") from None


def transcribe(
    card_path: Path, sources: dict[str, dict[str, str]] | None = None
) -> dict[str, list[Record]]:
    """``{recipe: [reference records]}`` for every study in the card's ``measured_results``."""
    card = _card(card_path)
    shown = card_path.relative_to(REPO) if card_path.is_relative_to(REPO) else card_path
    validated_on = str(card["validated_on"])
    return {
        STUDY_RECIPES[study["model"]]: transcribe_study(study, str(shown), validated_on, sources)
        for study in card["measured_results"]
    }


def write_seed(
    card_path: Path,
    records_dir: Path,
    golden_dir: Path | None = None,
    mcore_trees: list[Path] | None = None,
) -> list[Path]:
    """Write one reference-record file per study, and a golden per study that names its revisions."""
    written = []
    sources = derive_sources(card_path, records_dir, list(mcore_trees or []))
    for recipe, records in transcribe(card_path, sources).items():
        path = records_dir / f"seed-{recipe}.json"
        write_json_atomic(path, [record.to_json() for record in records])
        written.append(path)
        first = records[0]
        if first.revisions.megatron_core.commit is None:
            continue  # no revision on the card (historical Llama rows): records only, never a golden
        golden = golden_from_records(
            records,
            provenance={
                "source": PROVENANCE_SOURCE,
                "command": "python -m harness.golden.seed",
                "host": None,
                "date": first.created,
                "gpu": f"{first.hardware.gpu_count}x {first.hardware.device}",
                "driver": None,
            },
        )
        path = golden_path_for(records, writable(golden_root(golden_dir)))
        write_golden(path, golden)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--card", type=Path, default=DEFAULT_CARD)
    parser.add_argument("--records-dir", type=Path, default=RECORDS_DIR)
    parser.add_argument("--golden-dir", type=Path, help="golden root (default: as every command)")
    parser.add_argument(
        "--mcore-tree",
        type=Path,
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="a clean Megatron-LM git work tree at a commit the card pins: derive its version "
        "and source fingerprint for the pins (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        written = write_seed(
            args.card.resolve(), args.records_dir, args.golden_dir, args.mcore_tree
        )
    except UsageError as exc:
        print(f"harness.golden.seed: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
