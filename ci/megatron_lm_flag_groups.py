"""Write harness/data/megatron-lm/flag-groups-<commit>.json: every flag ``pretrain_gpt.py`` takes, by
the argument group Megatron-LM declares it in, read from Megatron-LM's own sources at one commit.

``plan --world-size N -- <flags>`` reads the file to tell a flag it does not model from one that
cannot change memory (a logging, checkpointing, schedule, ... group: harness.estimate.megatron_lm).
Megatron-LM's ``megatron/training/arguments.py`` adds flags two ways, both read here without importing
it: ``add_argument('--flag', ...)`` calls in each ``_add_<group>_args`` function, and dataclass
factories (``ArgumentGroupFactory(Config)``: one ``--field-name`` per field; a bool field that
defaults to True as ``--no-field-name`` and ``--disable-field-name``; a field's
``argparse_meta["arg_names"]`` instead where it has one; the ``exclude`` list left out). The
transformer configuration group is not written: it is ``TransformerConfig``'s fields, which the
harness reads from the installed Megatron Core.

  ./venv-run python ci/megatron_lm_flag_groups.py [--commit d98e8a64] [--repo ~/.cache/recompute-harness/megatron-lm.git]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGUMENTS = "megatron/training/arguments.py"
CONFIG_MODULES = (
    "megatron/training/config/training_config.py",
    "megatron/training/config/common_config.py",
    "megatron/training/config/resilience_config.py",
)


def _show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, "show", f"{commit}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _dataclass_flags(source: str) -> dict[str, list[str]]:
    """Per dataclass: the flags ArgumentGroupFactory makes of its fields."""
    flags: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        names: list[str] = []
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            name, default, meta_names = item.target.id, None, None
            if isinstance(item.value, ast.Call) and getattr(item.value.func, "id", "") == "field":
                for keyword in item.value.keywords:
                    if keyword.arg == "default":
                        default = _literal(keyword.value)
                    if keyword.arg == "metadata":
                        meta = _literal(keyword.value)
                        if isinstance(meta, dict):
                            meta_names = meta.get("argparse_meta", {}).get("arg_names")
            elif item.value is not None:
                default = _literal(item.value)
            dashed = name.replace("_", "-")
            if meta_names:
                names.append(f"{name}:" + ",".join(meta_names))
            elif ast.unparse(item.annotation) == "bool" and default is True:
                names.append(f"{name}:--no-{dashed},--disable-{dashed}")
            else:
                names.append(f"{name}:--{dashed}")
        flags[node.name] = names
    return flags


def flag_groups(repo: str, commit: str) -> dict[str, list[str]]:
    """Argument group (the ``_add_<group>_args`` function) -> its flags, sorted."""
    fields: dict[str, list[str]] = {}
    for module in CONFIG_MODULES:
        fields.update(_dataclass_flags(_show(repo, commit, module)))
    groups: dict[str, list[str]] = {}
    for function in ast.parse(_show(repo, commit, ARGUMENTS)).body:
        if not (isinstance(function, ast.FunctionDef) and function.name.startswith("_add_")):
            continue
        found: set[str] = set()
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            if getattr(node.func, "attr", "") == "add_argument":
                found.update(
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                )
            if getattr(node.func, "id", "") == "ArgumentGroupFactory" and node.args:
                config = getattr(node.args[0], "id", "")
                excluded = set()
                for keyword in node.keywords:
                    if keyword.arg == "exclude":
                        excluded = set(_literal(keyword.value) or ())
                for entry in fields.get(config, []):
                    name, names = entry.split(":", 1)
                    if name not in excluded:
                        found.update(names.split(","))
        group = function.name.removeprefix("_add_").removesuffix("_args")
        groups[group] = sorted(found)
    return groups


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="d98e8a64")
    parser.add_argument(
        "--repo",
        default=os.environ.get("MEGATRON_LM_GIT")
        or str(Path.home() / ".cache" / "recompute-harness" / "megatron-lm.git"),
    )
    args = parser.parse_args(argv)
    groups = flag_groups(args.repo, args.commit)
    target = ROOT / "harness" / "data" / "megatron-lm" / f"flag-groups-{args.commit}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "provenance": {
            "source": f"Megatron-LM {args.commit}: {ARGUMENTS}, {', '.join(CONFIG_MODULES)}",
            "command": f"python ci/megatron_lm_flag_groups.py --commit {args.commit}",
        },
        "groups": groups,
    }
    target.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target.relative_to(ROOT)}: {sum(map(len, groups.values()))} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
