"""Capture every command's output (docs/commands.md), exit code and written golden bytes on fixed inputs, to prove a
refactor changed no behaviour.

    python3 benchmarks/behaviour_capture.py capture OUTDIR [CODE]  # each command's rc/stdout/stderr
    python3 benchmarks/behaviour_capture.py diff BEFORE AFTER    # exit 1, naming each difference

``CODE`` (default: this checkout) is the tree whose ``harness`` runs, on ``PYTHONPATH`` in this
checkout's venv: capture an export of the commit before a change (``git archive REV | tar -x -C DIR``)
and then this checkout, and diff the two. The tree's own path is masked, and so are values that differ
run to run by nature (timestamps, host names, wall times, a real torchrun's step times); everything
else must match byte for byte, including every golden a write command produces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(tempfile.gettempdir()) / "recompute-harness-behaviour-capture"
SEEDS = ROOT / "harness/data/reference"
ENV_GOLDEN_DIR = "RECOMPUTE_HARNESS_GOLDEN_DIR"

# Run-to-run values: masked in every captured text so only behaviour is compared.
_MASKS = [
    (re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?"), "<time>"),
    (re.compile(r"\b\d+(\.\d+)? ?s\b"), "<secs> s"),
    (re.compile(re.escape(os.uname().nodename)), "<host>"),
    (re.compile(r'"(wall_s|elapsed_s|duration_s|seconds)": [0-9.e+-]+'), r'"\1": <secs>'),
    # torchrun's per-job log directory: a random run id
    (re.compile(r"-control-[0-9a-f]{8}_[0-9a-z]{8}"), "-control-<torchrun-id>"),
    # a sweep directory's name: recipe, start time, random suffix
    (re.compile(r"-(\d{8}T\d{6}Z|<n>T<n>Z)-[0-9a-z<>]+"), "-<sweep>"),
    # a Python set printed by Megatron Core: its order follows string hashing, random per process
    (re.compile(r"\{'[^{}]*'\}"), lambda m: "{" + ", ".join(sorted(m[0][1:-1].split(", "))) + "}"),
]


def _commands() -> list[tuple[str, list[str]]]:
    """(name, argv after ``recompute-harness``): every command of docs/commands.md on fixed inputs."""
    gold = str(WORK / "golden")
    moon = [str(SEEDS / "seed-moonlight-full-8gpu.json")]
    nemo = [str(SEEDS / "seed-nemotron-3-nano-full-16gpu.json")]
    return [
        ("version", ["--version"]),
        ("revisions", ["revisions"]),
        ("revisions-json", ["revisions", "--json"]),
        ("labels", ["labels"]),
        ("labels-json", ["labels", "--json"]),
        ("labels-check", ["labels", "--check", "--golden-dir", gold]),
        ("labels-write", ["labels", "--write-manifest", "--golden-dir", gold]),
        ("validate-ok", ["validate", "--granularity", "selective", "--modules", "core_attn"]),
        (
            "validate-json",
            [
                "validate",
                "--granularity",
                "full",
                "--method",
                "uniform",
                "--num-layers",
                "1",
                "--json",
            ],
        ),
        (
            "validate-rejected",
            ["validate", "--granularity", "selective", "--modules", "mla_up_proj"],
        ),
        ("validate-bad", ["validate", "--granularity", "selective", "--modules", "nonsense"]),
        ("matrix", ["matrix"]),
        ("matrix-check", ["matrix", "--check", "--count", "40", "--seed", "3", "--json"]),
        ("probe-list", ["probe", "--list"]),
        ("probe-one", ["probe", "--model", "dense-tiny", "--modules", "core_attn", "--json"]),
        ("probe-check", ["probe", "--all", "--check-golden", "--golden-dir", gold]),
        ("probe-write", ["probe", "--all", "--write-golden", "--golden-dir", gold]),
        (
            "probe-write-fused",
            [
                "probe",
                "--all",
                "--attention-backend",
                "fused",
                "--write-golden",
                "--golden-dir",
                gold,
            ],
        ),
        (
            "estimate",
            ["estimate", "--recipe", "moonlight-full-8gpu", "--write-golden", "--golden-dir", gold],
        ),
        ("estimate-bad", ["estimate", "--recipe", "nope"]),
        (
            "run",
            ["run", "--recipe", "cpu-moonlight-ep2", "--rows", "[]", "--out", str(WORK / "run")],
        ),
        (
            "launch",
            [
                "launch",
                "--slurm",
                "--recipe",
                "moonlight-full-8gpu",
                "--script",
                str(WORK / "job.sbatch"),
            ],
        ),
        ("compare", ["compare", "--golden", gold, *moon]),
        ("compare-nemotron", ["compare", *nemo]),
        ("compare-json", ["compare", "--json", *moon]),
        ("analyze", ["analyze", *moon]),
        ("analyze-json", ["analyze", "--json", *moon]),
        ("select", ["select", "--target-gb", "60", *moon]),
        ("bump", ["bump", "--no-probe", "--count", "20", "--golden-dir", gold]),
        ("refresh-dry", ["golden", "refresh", *moon, "--dry-run", "--golden-dir", gold]),
        ("refresh", ["golden", "refresh", *moon, *nemo, "--golden-dir", gold]),
        ("refresh-json", ["golden", "refresh", *moon, "--json", "--golden-dir", gold]),
        ("refresh-bad", ["golden", "refresh", str(SEEDS / "card.yaml"), "--golden-dir", gold]),
    ]


def _mask(text: str, code: Path) -> str:
    text = text.replace(str(code), "<code>")
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def capture(out: Path, code: Path) -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    shutil.copytree(code / "tests/golden", WORK / "golden", symlinks=True)
    out.mkdir(parents=True, exist_ok=True)
    # This checkout's venv, as venv-run sets it up, but run in ``code`` with ``code`` on PYTHONPATH (so
    # ``python -m`` children import it too).
    venv = ROOT / ".venv"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", ENV_GOLDEN_DIR)},
        "PYTHONPATH": str(code),
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "TORCH_EXTENSIONS_DIR": os.environ.get(
            "TORCH_EXTENSIONS_DIR", str(venv / "torch-extensions")
        ),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for name, argv in _commands():
        done = subprocess.run(
            [str(venv / "bin/recompute-harness"), *argv],
            cwd=code,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        stdout = _mask(done.stdout, code)
        if name == "run":  # a real torchrun's step times and peaks vary: keep the verdicts only
            stdout = re.sub(r"\d[\d,.]*", "<n>", stdout)
        stderr = "" if name == "run" else _mask(done.stderr, code)
        (out / f"{name}.txt").write_text(
            f"rc={done.returncode}\n--stdout\n{stdout}--stderr\n{stderr}"
        )
        print(f"{name}: rc={done.returncode}", flush=True)
    files = {}
    for path in sorted((WORK / "golden").rglob("*")):
        if path.is_file():
            files[str(path.relative_to(WORK))] = _mask(path.read_text(encoding="utf-8"), code)
    files["run/"] = sorted(str(p.relative_to(WORK)) for p in (WORK / "run").rglob("*"))
    (out / "files.json").write_text(json.dumps(files, indent=1, sort_keys=True))
    shutil.rmtree(WORK, ignore_errors=True)


def diff(before: Path, after: Path) -> int:
    """Name each capture that differs once both are masked again (a capture may predate a mask)."""

    def text(path: Path) -> str | None:
        return _mask(path.read_text(encoding="utf-8"), WORK) if path.is_file() else None

    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    changed = [
        name
        for name in names
        if text(before / name) is None or text(before / name) != text(after / name)
    ]
    for name in changed:
        print(f"differs: {name}")
    print(f"{len(names) - len(changed)} of {len(names)} captures identical")
    return 1 if changed else 0


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "capture":
        capture(Path(sys.argv[2]), Path(sys.argv[3] if len(sys.argv) == 4 else ROOT).resolve())
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
