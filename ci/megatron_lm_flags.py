"""Write harness/data/megatron-lm/flags-<commit>.json: every flag Megatron-LM's argument parser
defines, with its destination and whether it can change what a training step allocates, decided flag
by flag from where Megatron-LM's own sources read it (not by argument group).

``plan --world-size N -- <flags>`` reads the file (harness.estimate.megatron_lm): a ``neutral`` flag
is ignored and listed; a ``memory`` flag is modelled where plan maps it and otherwise refused naming
its feature and the code that reads it.

How a flag is decided, at one commit, without importing Megatron-LM:

1. Flags and destinations: ``add_argument('--flag', ..., dest=...)`` in every ``_add_<group>_args``
   of ``megatron/training/arguments.py`` (and ModelOpt's ``add_modelopt_args``, which the pretrain
   scripts add where ModelOpt is installed), and the dataclass factories (``ArgumentGroupFactory(Config,
   exclude=[...])``: ``--field-name``; a bool that defaults to True as ``--no-``/``--disable-``; a
   field's ``argparse_meta["arg_names"]``). ``TransformerConfig`` (with ``ModelParallelConfig``) is
   read from ``megatron/core`` at the same commit.
2. ``memory`` (``site: model``): a field of ``TransformerConfig`` / ``MLATransformerConfig``:
   ``core_transformer_config_from_args`` copies every such ``args`` attribute into the config the
   model is built from.
3. ``neutral``: a flag whose value is a float and is not such a field (``type=float`` or a float
   annotation: learning rates, betas, epsilons, clipping, loss scales, coefficients, intervals in
   seconds). A scalar sets values, not the shapes or number of tensors a step allocates.
4. ``memory``: a flag whose destination is read (``args.<dest>``, ``getattr(args, "<dest>")``) in a
   place that builds what a step allocates (``MEMORY_SITES``: the model builders and providers, the
   batch and loss of ``pretrain_*.py``, ``get_model`` / DDP wrapping / the DDP and optimizer configs /
   ``setup_model_and_optimizer`` / ``train_step`` of training.py, anything under megatron/core but
   its tokenizers and inference), or
   copied into ``OptimizerConfig`` / ``DistributedDataParallelConfig`` by their ``dataclasses.fields``
   loops; or read in ``validate_args`` in a statement that assigns a ``memory`` destination (a
   derivation: ``--recompute-activations`` sets ``recompute_granularity``), to a fixpoint.
5. ``neutral``: everything else: read only by logging, checkpointing, data loading, initialisation,
   the training loop's bookkeeping, inference, the tokenizer, or not read at all.

Before all of these, ``NEUTRAL_READS``: destinations read where a step is built that still cannot
change what it allocates (seeds, timeouts, checkpoint paths, loss checks, ...), each with the reason,
decided by reading the code that reads them. ModelOpt's own flags are ``memory`` where its builder
or loaders read them (``MODELOPT``).

  ./venv-run python ci/megatron_lm_flags.py [--commit d98e8a64] [--repo ~/.cache/recompute-harness/megatron-lm.git]
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
# pretrain_gpt.py / pretrain_hybrid.py add these where ModelOpt is installed (extra_args_provider).
EXTRA_ARGUMENTS = ("megatron/post_training/arguments.py",)
CONFIG_MODULES = (
    "megatron/training/config/training_config.py",
    "megatron/training/config/common_config.py",
    "megatron/training/config/resilience_config.py",
    "megatron/core/model_parallel_config.py",
    "megatron/core/transformer/transformer_config.py",
)
MODEL_CONFIGS = ("TransformerConfig", "MLATransformerConfig", "ModelParallelConfig")
COPIED_CONFIGS = {
    "OptimizerConfig": ("megatron/core/optimizer/optimizer_config.py", "optimizer"),
    "DistributedDataParallelConfig": (
        "megatron/core/distributed/distributed_data_parallel_config.py",
        "ddp",
    ),
}
# (path, functions or None for the whole file) -> site: where a read changes what a step allocates.
MEMORY_SITES: tuple[tuple[str, frozenset[str] | None, str], ...] = (
    ("gpt_builders.py", None, "model"),
    ("hybrid_builders.py", None, "model"),
    ("mamba_builders.py", None, "model"),
    ("model_provider.py", None, "model"),
    (
        "megatron/training/argument_utils.py",
        frozenset(
            {"core_transformer_config_from_args", "gpt_config_from_args", "hybrid_config_from_args"}
        ),
        "model",
    ),
    ("pretrain_gpt.py", frozenset({"get_batch", "loss_func", "forward_step"}), "schedule"),
    ("pretrain_hybrid.py", frozenset({"get_batch", "loss_func", "forward_step"}), "schedule"),
    ("pretrain_mamba.py", frozenset({"get_batch", "loss_func", "forward_step"}), "schedule"),
    (
        "megatron/training/training.py",
        frozenset(
            {
                "resolve_ddp_bucket_size",
                "wrap_model_chunks_with_ddp",
                "_forward_backward_grad_context",
                "get_model",
                "get_megatron_ddp_config",
                "setup_model_and_optimizer",
                "train_step",
            }
        ),
        "training",
    ),
    ("megatron/core/", None, "core"),
)
# ModelOpt's own flags act through its model builder and checkpoint loading (a distillation
# teacher, quantizers, export specs): memory where read under here. Other flags read here (the
# builder also reads --manual-gc, its loader --dist-ckpt-strictness) keep their own classification:
# this code runs only with ModelOpt's flags.
MODELOPT = "megatron/post_training/"
# Read under megatron/core but not by a training step: the tokenizer (its vocabulary size is what
# sizes memory, and plan reads it from --vocab-size / --tokenizer-type / the vocabulary file) and
# inference.
NOT_TRAINING = ("megatron/core/tokenizers/", "megatron/core/inference/")
# Destinations read where a step is built that still cannot change what it allocates, each with why
# (decided flag by flag from the code that reads them).
NEUTRAL_READS = {
    "seed": "seeds the RNGs (and inference sampling): values, not tensors",
    "init_method_xavier_uniform": "initialisation: values, not shapes",
    "data_parallel_random_init": "initialisation: values, not shapes",
    "distributed_timeout_minutes": "a process-group timeout",
    "use_gloo_process_groups": "CPU (gloo) process groups, no GPU tensors",
    "create_all_gather_group": "a process group (NCCL's buffers are outside the allocator)",
    "save": "where checkpoints go",
    "load": "where checkpoints come from (loaded before the first step)",
    "pretrained_checkpoint": "where checkpoints come from (loaded before the first step)",
    "no_load_optim": "whether a checkpoint's optimizer state is loaded (before the first step)",
    "ckpt_format": "the checkpoint format",
    "ckpt_convert_format": "checkpoint conversion",
    "ckpt_convert_save": "checkpoint conversion",
    "exit_on_missing_checkpoint": "what a missing checkpoint does",
    "record_memory_history": "the allocator's history, kept in host memory",
    "memory_snapshot_path": "where the allocator's history is written",
    "dump_param_to_param_group_map": "writes a file",
    "log_num_zeros_in_grad": "a logged count",
    "check_for_nan_in_loss_and_grad": "checks of scalars (loss, gradient norm)",
    "check_for_spiky_loss": "checks of a scalar (the loss)",
    "check_for_large_grads": "checks of a scalar (the gradient norm)",
    "hysteresis": "the loss scaler's schedule",
    "no_weight_decay_cond_type": "which parameters get weight decay: values",
    "apply_wd_to_qk_layernorm": "which parameters get weight decay: values",
    "fake_process_group": "a test process group: no communication, the same tensors",
    "rotary_seq_len_interpolation_factor": "scales rotary positions: values, not shapes",
    "use_rope_scaling": "Llama 3's rotary frequency scaling: values, not shapes",
    "empty_unused_memory_level": "empties the allocator's cache: what is allocated is the same",
}
READ_ROOTS = ("megatron/", "pretrain_gpt.py", "pretrain_hybrid.py", "pretrain_mamba.py")
READ_ROOTS_EXTRA = (
    "gpt_builders.py",
    "hybrid_builders.py",
    "mamba_builders.py",
    "model_provider.py",
)


def _git(repo: str, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, *args], check=True, capture_output=True, text=True
    ).stdout


def _literal(node: ast.AST | None) -> object:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _dataclass_fields(source: str) -> dict[str, list[dict[str, object]]]:
    """Per class: its annotated fields (name, annotation, default, argparse names), with the
    fields of the bases found in the same sources added by the caller."""
    out: dict[str, list[dict[str, object]]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = []
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            default, meta_names = None, None
            value = item.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
                for keyword in value.keywords:
                    if keyword.arg == "default":
                        default = _literal(keyword.value)
                    if keyword.arg == "metadata":
                        meta = _literal(keyword.value)
                        if isinstance(meta, dict):
                            meta_names = meta.get("argparse_meta", {}).get("arg_names")
            else:
                default = _literal(value)
            fields.append(
                {
                    "name": item.target.id,
                    "annotation": ast.unparse(item.annotation),
                    "default": default,
                    "names": meta_names,
                }
            )
        out[node.name] = fields
        out[node.name + ".__bases__"] = [{"name": ast.unparse(b)} for b in node.bases]
    return out


def _with_bases(classes: dict[str, list[dict[str, object]]], name: str) -> list[dict[str, object]]:
    fields: list[dict[str, object]] = []
    for base in classes.get(name + ".__bases__", []):
        fields += _with_bases(classes, str(base["name"]))
    return fields + classes.get(name, [])


def _factory_flags(field: dict[str, object]) -> list[str]:
    dashed = "--" + str(field["name"]).replace("_", "-")
    if field["names"]:
        return list(field["names"])
    if field["annotation"] == "bool" and field["default"] is True:
        return [f"--no-{dashed[2:]}", f"--disable-{dashed[2:]}"]
    return [dashed]


def parser_flags(repo: str, commit: str) -> dict[str, dict[str, object]]:
    """Every flag arguments.py defines -> {dest, group, float}."""
    classes: dict[str, list[dict[str, object]]] = {}
    for module in CONFIG_MODULES:
        classes.update(_dataclass_fields(_git(repo, "show", f"{commit}:{module}")))
    flags: dict[str, dict[str, object]] = {}
    functions = [
        function
        for module in (ARGUMENTS, *EXTRA_ARGUMENTS)
        for function in ast.parse(_git(repo, "show", f"{commit}:{module}")).body
        if isinstance(function, ast.FunctionDef)
        and function.name.startswith(("_add_", "add_"))
        and function.name.endswith("_args")
    ]
    for function in functions:
        group = function.name.removeprefix("_").removeprefix("add_").removesuffix("_args")
        # ``exclude=exclude``: the list assigned to that name in the same function
        lists = {
            t.id: _literal(n.value)
            for n in ast.walk(function)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            if getattr(node.func, "attr", "") == "add_argument":
                names = [
                    str(a.value)
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                ]
                if not names:
                    continue
                keywords = {k.arg: k.value for k in node.keywords}
                dest = _literal(keywords.get("dest")) or names[0][2:].replace("-", "_")
                is_float = getattr(keywords.get("type"), "id", "") == "float"
                for name in names:
                    flags[name] = {"dest": dest, "group": group, "float": is_float}
            if getattr(node.func, "id", "") == "ArgumentGroupFactory" and node.args:
                config = getattr(node.args[0], "id", "")
                excluded: set[str] = set()
                for k in node.keywords:
                    if k.arg == "exclude":
                        value = (
                            lists.get(k.value.id)
                            if isinstance(k.value, ast.Name)
                            else _literal(k.value)
                        )
                        excluded.update(str(x) for x in value or ())
                for field in _with_bases(classes, config):
                    if field["name"] in excluded:
                        continue
                    annotation = str(field["annotation"])
                    for name in _factory_flags(field):
                        flags[name] = {
                            "dest": field["name"],
                            "group": group,
                            "float": annotation in ("float", "Optional[float]", "float | None"),
                        }
    return flags


class _Reads(ast.NodeVisitor):
    """``args.<x>`` / ``getattr(args, "x")`` reads per enclosing top-level function, and, in
    validate_args, per statement the destinations it assigns."""

    def __init__(self) -> None:
        self.function = "<module>"
        self.reads: dict[str, set[str]] = {}

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer = self.function
        if outer == "<module>":  # a nested function's reads are its enclosing function's
            self.function = node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in ("args", "_args"):
            self.reads.setdefault(node.attr, set()).add(self.function)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (
            getattr(node.func, "id", "") in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and getattr(node.args[0], "id", "") in ("args", "_args")
        ):
            self.reads.setdefault(str(node.args[1].value), set()).add(self.function)
        self.generic_visit(node)


def _site(path: str, function: str) -> str | None:
    if path.startswith(NOT_TRAINING):
        return None
    for prefix, functions, site in MEMORY_SITES:
        if (path == prefix or (prefix.endswith("/") and path.startswith(prefix))) and (
            functions is None or function in functions
        ):
            return site
    return None


def _derivations(source: str) -> list[tuple[set[str], set[str]]]:
    """validate_args' statements as (destinations read, destinations assigned) pairs: each
    innermost ``if`` (or simple statement) that assigns an ``args`` attribute."""
    out = []
    for function in ast.parse(source).body:
        if not (isinstance(function, ast.FunctionDef) and function.name == "validate_args"):
            continue
        for node in ast.walk(function):
            if not isinstance(node, (ast.If, ast.Assign, ast.AugAssign)):
                continue
            assigned: set[str] = set()
            read: set[str] = set()
            body = node.body if isinstance(node, ast.If) else [node]
            for statement in body:
                if isinstance(statement, (ast.Assign, ast.AugAssign)):
                    targets = (
                        statement.targets
                        if isinstance(statement, ast.Assign)
                        else [statement.target]
                    )
                    for target in targets:
                        if (
                            isinstance(target, ast.Attribute)
                            and getattr(target.value, "id", "") == "args"
                        ):
                            assigned.add(target.attr)
            for sub in ast.walk(node.test if isinstance(node, ast.If) else node.value):
                if isinstance(sub, ast.Attribute) and getattr(sub.value, "id", "") == "args":
                    read.add(sub.attr)
            if assigned and read:
                out.append((read, assigned))
    return out


def classify(repo: str, commit: str) -> dict[str, dict[str, object]]:
    flags = parser_flags(repo, commit)
    classes: dict[str, list[dict[str, object]]] = {}
    for module in CONFIG_MODULES:
        classes.update(_dataclass_fields(_git(repo, "show", f"{commit}:{module}")))
    model_fields = {str(f["name"]) for c in MODEL_CONFIGS for f in _with_bases(classes, c)}
    copied: dict[str, str] = {}
    for name, (module, site) in COPIED_CONFIGS.items():
        for field in _dataclass_fields(_git(repo, "show", f"{commit}:{module}")).get(name, []):
            copied.setdefault(str(field["name"]), f"{site}: {name}")
    paths = [
        p
        for p in _git(repo, "ls-tree", "-r", "--name-only", commit).split()
        if p.endswith(".py")
        and (p.startswith(READ_ROOTS) or p in READ_ROOTS_EXTRA)
        and "/tests/" not in p
    ]
    sites: dict[str, set[str]] = {}
    modelopt: dict[str, set[str]] = {}
    for path in paths:
        try:
            tree = ast.parse(_git(repo, "show", f"{commit}:{path}"))
        except SyntaxError:
            continue
        reads = _Reads()
        reads.visit(tree)
        for dest, functions in reads.reads.items():
            if path.startswith(MODELOPT):
                modelopt.setdefault(dest, set()).update(f"{path}:{f}" for f in functions)
                continue
            for function in functions:
                site = _site(path, function)
                if site is not None:
                    sites.setdefault(dest, set()).add(f"{path}:{function}")
    memory = set(sites) | set(copied) | model_fields
    derivations = _derivations(_git(repo, "show", f"{commit}:{ARGUMENTS}"))
    derived_from: dict[str, set[str]] = {}
    changed = True
    while changed:
        changed = False
        for read, assigned in derivations:
            hit = assigned & memory
            if not hit:
                continue
            for dest in read - memory:
                memory.add(dest)
                derived_from.setdefault(dest, set()).update(hit)
                changed = True
    table: dict[str, dict[str, object]] = {}
    for flag, entry in sorted(flags.items()):
        dest = str(entry["dest"])
        row: dict[str, object] = {"dest": dest, "group": entry["group"]}
        if dest in NEUTRAL_READS:
            row.update(kind="neutral", why=NEUTRAL_READS[dest])
        elif dest in model_fields:
            row.update(kind="memory", site="model: TransformerConfig")
        elif entry["float"]:
            row.update(kind="neutral", why="a float: sets values, not shapes")
        elif entry["group"] == "modelopt" and dest in modelopt:
            row.update(kind="memory", site=", ".join(sorted(modelopt[dest])[:3]))
        elif dest in copied:
            row.update(kind="memory", site=copied[dest])
        elif dest in sites:
            row.update(kind="memory", site=", ".join(sorted(sites[dest])[:3]))
        elif dest in derived_from:
            row.update(
                kind="memory",
                site="validate_args derives " + ", ".join(sorted(derived_from[dest])[:3]),
            )
        else:
            row.update(kind="neutral", why="read by no code that builds a step's tensors")
        table[flag] = row
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="d98e8a64")
    parser.add_argument(
        "--repo",
        default=os.environ.get("MEGATRON_LM_GIT")
        or str(Path.home() / ".cache" / "recompute-harness" / "megatron-lm.git"),
    )
    args = parser.parse_args(argv)
    table = classify(args.repo, args.commit)
    target = ROOT / "harness" / "data" / "megatron-lm" / f"flags-{args.commit}.json"
    document = {
        "provenance": {
            "source": f"Megatron-LM {args.commit}: {ARGUMENTS}, its config dataclasses, and every "
            "read of args.<dest> under megatron/ and the pretrain / builder scripts",
            "command": f"python ci/megatron_lm_flags.py --commit {args.commit}",
        },
        "flags": table,
    }
    target.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    kinds = [str(row["kind"]) for row in table.values()]
    print(
        f"wrote {target.relative_to(ROOT)}: {len(table)} flags, "
        f"{kinds.count('memory')} memory, {kinds.count('neutral')} neutral"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
