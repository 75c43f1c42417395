"""How many of Megatron-LM's own functional-test training commands ``plan`` accepts (issue #43's
acceptance figure), and why each of the rest is refused.

The commands are the ``MODEL_ARGS`` of ``tests/functional_tests/test_cases/{gpt,moe,hybrid}/*/
model_config.yaml`` at d98e8a64, read from the Megatron-LM git mirror (``$MEGATRON_LM_GIT``, by
default ``~/.cache/recompute-harness/megatron-lm.git``) and turned into an argument list as
Megatron-LM's ``_run_training.sh`` does it (``true`` -> the flag alone, ``""`` -> left out, a
``[a, b]`` list -> its items). Inference and RL cases (``MODE``) are left out; every recipe of these
three models runs on one 8-GPU node (tests/test_utils/recipes/h100/{gpt,moe,mamba}.yaml). Golden
values are never read. Only the parse is timed and judged (no layer measurement).

  ./venv-run python benchmarks/megatron_lm_test_cases.py [--verbose]
  ./venv-run python benchmarks/megatron_lm_test_cases.py --plan gpt/NAME moe/NAME ...  # end to end
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

COMMIT = "d98e8a64"
MODELS = ("gpt", "moe", "hybrid")
WORLD_SIZE = 8  # recipes/h100/{gpt,moe,mamba}.yaml: nodes 1, gpus 8
REPO = Path(
    os.environ.get("MEGATRON_LM_GIT")
    or Path.home() / ".cache" / "recompute-harness" / "megatron-lm.git"
)
# Values _run_training.sh fills from the environment: a placeholder path (plan reads no data).
_PLACEHOLDER = "/nonexistent"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout


def _value(value: object) -> list[str]:
    if isinstance(value, list):
        return [str(item) for item in value]
    text = str(value).strip()
    if "$" in text:
        return [_PLACEHOLDER]
    if text.startswith("[") and text.endswith("]"):  # _run_training.sh: brackets off, words split
        return text[1:-1].split()
    return [text]


def model_args_to_flags(model_args: dict[str, object]) -> list[str]:
    """``MODEL_ARGS`` as ``_run_training.sh`` hands them to ``pretrain_*.py``."""
    flags: list[str] = []
    for key, value in model_args.items():
        if value is True:
            flags.append(key)
        elif value == "" or value is None:
            continue
        else:
            flags += [key, *_value(value)]
    return flags


def test_case_commands() -> list[tuple[str, list[str]]]:
    """(model/test case, its argument list) for every training test case of the three models;
    empty where the mirror lacks the commit."""
    try:
        names = _git("ls-tree", "-r", "--name-only", COMMIT, "tests/functional_tests/test_cases/")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return []
    out = []
    for path in sorted(names.split()):
        parts = path.split("/")
        if not path.endswith("/model_config.yaml") or parts[3] not in MODELS:
            continue
        document = yaml.safe_load(_git("show", f"{COMMIT}:{path}"))
        if document.get("MODE") not in (None, "pretraining") or not document.get("MODEL_ARGS"):
            continue
        out.append((f"{parts[3]}/{parts[4]}", model_args_to_flags(document["MODEL_ARGS"])))
    return out


def judge(flags: list[str]) -> str | None:
    """None when plan accepts the command; else the one line it refuses it with."""
    from harness.errors import UsageError
    from harness.estimate.megatron_lm import parse_megatron_lm

    try:
        parse_megatron_lm(flags, WORLD_SIZE)
    except UsageError as refused:
        return str(refused)
    return None


def plan_end_to_end(cases: dict[str, list[str]], names: list[str]) -> None:
    """``plan --world-size 8 -- <the case's flags>`` for each named case: exit, wall time, and its
    last line (the verdict, or the one-line refusal)."""
    for name in names:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "plan", "--world-size", str(WORLD_SIZE), "--"]
            + cases[name],
            capture_output=True,
            text=True,
            check=False,
        )
        last = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or [""])[-1]
        print(f"{name}: exit {done.returncode}, {time.monotonic() - started:.0f} s: {last}")


def main(argv: list[str]) -> int:
    cases = test_case_commands()
    if not cases:
        print(f"no Megatron-LM mirror with {COMMIT} at {REPO}: nothing to judge")
        return 0
    if argv[:1] == ["--plan"]:
        plan_end_to_end(dict(cases), argv[1:])
        return 0
    reasons: collections.Counter[str] = collections.Counter()
    by_model: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for name, flags in cases:
        refusal = judge(flags)
        model = name.split("/")[0]
        by_model[model][1] += 1
        if refusal is None:
            by_model[model][0] += 1
        else:
            reasons[refusal] += 1
        if "--verbose" in argv:
            print(f"{name}: {'accepted' if refusal is None else refusal}")
    accepted = sum(a for a, _ in by_model.values())
    print(f"accepted {accepted} of {len(cases)} ({100 * accepted / len(cases):.0f} %)")
    for model, (a, n) in sorted(by_model.items()):
        print(f"  {model}: {a} of {n}")
    for reason, count in reasons.most_common():
        print(f"  {count:4d}  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
