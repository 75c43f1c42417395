"""Recipes: the workloads a sweep runs, kept as TOML data under ``harness/data/recipes/``.

A recipe names a back end (``bridge`` or ``mcore``), a model, the device and world shape, the
parallel layout, batch and sequence sizes, the iteration count and steady window, and the rows to
sweep (row names as ``RecomputeFields.name`` spells them: ``[]``, ``moe_act``, ``layernorm+moe_act``,
``full-uniform-1``). A recipe may start from another with ``base = "name"`` (tables merge, values
replace). Everything a user can get wrong is refused here, on one line, before anything launches.

``--recipe`` takes a packaged name or a path to a ``.toml`` file anywhere (a Bridge repo's own recipes;
its ``base`` may be a packaged name or a path relative to the file). Bridge builders beyond the two
shipped ones come from the entry point group ``recompute_harness.recipes``: ``name = "pkg.mod:builder"``,
where ``builder(options) -> ConfigContainer`` receives the recipe's ``[bridge]`` table.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from harness.config.fields import CONTROL_ROW, RecomputeFields
from harness.errors import UsageError
from harness.processes import run_bounded
from harness.record.model import ParallelLayout

BACKENDS = ("bridge", "mcore")
DEVICES = ("cuda", "cpu")
PARALLEL_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp")
BRIDGE_RECIPES = (
    "moonlight_16b",
    "nemotron_3_nano",
    "llama3_70b_sft_fp8cs",
)  # builders in harness.run.backend_bridge.RECIPES
ENTRY_POINT_GROUP = (
    "recompute_harness.recipes"  # more Bridge builders, from other installed packages
)
MCORE_PRECISIONS = ("fp32", "bf16", "fp16")  # parameter dtypes of the mcore back end's loop

# What a back end imports on every rank whatever the recipe says: Bridge's ``pretrain`` module imports
# nvidia-resiliency-ext's in-process restart API unconditionally (megatron/bridge/training/pretrain.py).
BACKEND_REQUIRES = {"bridge": ("megatron.bridge", "nvidia_resiliency_ext.inprocess"), "mcore": ()}
_INSTALL_HINT = {
    "megatron.bridge": "pip install 'recompute-harness[bridge]' on a CUDA machine with Transformer Engine",
    "nvidia_resiliency_ext.inprocess": "pip install nvidia-resiliency-ext (Bridge's pretrain imports it)",
    "transformer_engine": "Transformer Engine must be built against the machine's CUDA",
    "mamba_ssm": "pip install mamba-ssm (CUDA build)",
}


@dataclass(frozen=True)
class Parallelism:
    """MCore's parallel sizes; ``etp`` (expert tensor parallel) defaults to ``tp`` as in MCore."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    vpp: int | None = None

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    def data_parallel(self, world: int) -> int:
        return world // (self.tp * self.pp * self.cp)

    def expert_data_parallel(self, world: int) -> int:
        return world // (self.expert_tp * self.ep * self.pp)

    def record_layout(self, world: int) -> ParallelLayout:
        """The record's ``workload.parallelism`` (dp and expert_dp derived from the world size)."""
        return ParallelLayout(
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            dp=self.data_parallel(world),
            expert_dp=self.expert_data_parallel(world),
            vpp=self.vpp,
        )


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    backend: str
    model: str
    device: str
    nnodes: int
    nproc_per_node: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    train_iters: int
    precision: str
    attention_backend: str
    steady_window: tuple[int, int]
    rows: tuple[str, ...]
    parallelism: Parallelism
    hardware: str | None = None
    requires: tuple[str, ...] = ()
    timeout_s: float = 600.0
    stall_timeout_s: float = 300.0
    # The silence allowed until every rank has finished iteration 1 (compilation, autotune, JIT); None:
    # the stall timeout.
    first_iteration_timeout_s: float | None = None
    backend_options: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the row spec a worker reads (the worker never re-reads TOML)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        values = dict(data)
        values["steady_window"] = tuple(values["steady_window"])
        values["rows"] = tuple(values["rows"])
        values["requires"] = tuple(values["requires"])
        values["parallelism"] = Parallelism(**values["parallelism"])
        values["timeout_s"], values["stall_timeout_s"] = (
            float(values["timeout_s"]),
            float(values["stall_timeout_s"]),
        )
        first = values.get("first_iteration_timeout_s")
        values["first_iteration_timeout_s"] = None if first is None else float(first)
        return cls(**values)


# A recipe file's keys are Recipe's fields, except: ``name`` is the file's, ``parallelism`` may be
# omitted (all 1), the back end's own table (``[bridge]`` / ``[mcore]``) becomes ``backend_options``,
# and ``base`` names the recipe it starts from.
_FIELDS = {
    f.name: f for f in dataclasses.fields(Recipe) if f.name not in ("name", "backend_options")
}
_REQUIRED = tuple(
    name
    for name, f in _FIELDS.items()
    if name != "parallelism"
    and f.default is dataclasses.MISSING
    and f.default_factory is dataclasses.MISSING
)
_OPTIONAL = (*(name for name in _FIELDS if name not in _REQUIRED), "base", *BACKENDS)


def recipe_names() -> list[str]:
    folder = resources.files("harness").joinpath("data", "recipes")
    return sorted(
        entry.name[: -len(".toml")] for entry in folder.iterdir() if entry.name.endswith(".toml")
    )


def bridge_builders() -> dict[str, metadata.EntryPoint]:
    """Bridge recipe builders other packages register under ``recompute_harness.recipes``."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def bridge_recipe_names() -> list[str]:
    return [*BRIDGE_RECIPES, *sorted(set(bridge_builders()) - set(BRIDGE_RECIPES))]


def is_recipe_file(name: str) -> bool:
    """A ``--recipe`` value naming a file (a path, or ending in .toml) rather than a packaged recipe."""
    return name.endswith(".toml") or "/" in name


def recipe_display_name(name: str) -> str:
    """The recipe name records and goldens carry: a file's stem, or the packaged name."""
    return Path(name).stem if is_recipe_file(name) else name


def _raw(name: str, chain: tuple[str, ...] = (), relative_to: Path | None = None) -> dict[str, Any]:
    if is_recipe_file(name):
        path = Path(name) if relative_to is None or Path(name).is_absolute() else relative_to / name
        key = str(path.resolve())
    else:
        key = name
    if key in chain:
        raise UsageError(f"recipe {chain[0]!r}: circular base chain {' -> '.join((*chain, key))}")
    if is_recipe_file(name):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"recipe file {path}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        folder: Path | None = path.parent
    else:
        names = recipe_names()
        if name not in names:
            raise UsageError(
                f"unknown recipe {name!r} (known: {', '.join(names)}; or a path to a .toml file)"
            )
        text = (
            resources.files("harness")
            .joinpath("data", "recipes", f"{name}.toml")
            .read_text(encoding="utf-8")
        )
        folder = None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"recipe {name!r}: malformed TOML: {exc}") from None
    base = data.pop("base", None)
    return _merge(_raw(base, (*chain, key), folder), data) if base else data


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_recipe(name: str) -> Recipe:
    """Load, merge and check one recipe, by packaged name or file path (layout arithmetic included;
    packages are checked at launch)."""
    data = _raw(name)
    name = recipe_display_name(name)
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise UsageError(f"recipe {name!r}: missing {', '.join(missing)}")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise UsageError(f"recipe {name!r}: unknown key(s) {', '.join(unknown)}")
    if data["backend"] not in BACKENDS:
        raise UsageError(
            f"recipe {name!r}: backend {data['backend']!r} is not one of {', '.join(BACKENDS)}"
        )
    if data["device"] not in DEVICES:
        raise UsageError(
            f"recipe {name!r}: device {data['device']!r} is not one of {', '.join(DEVICES)}"
        )
    layout = dict(data.get("parallelism", {}))
    unknown_layout = sorted(set(layout) - set(PARALLEL_KEYS))
    if unknown_layout:
        raise UsageError(f"recipe {name!r}: unknown parallelism key(s) {', '.join(unknown_layout)}")
    window = data["steady_window"]
    if not (
        isinstance(window, list) and len(window) == 2 and all(isinstance(i, int) for i in window)
    ):
        raise UsageError(f"recipe {name!r}: steady_window must be [first, last] iterations")
    backend = data["backend"]
    if backend == "bridge" and data.get("bridge", {}).get("recipe") not in bridge_recipe_names():
        raise UsageError(
            f"recipe {name!r}: [bridge] recipe must be one of {', '.join(bridge_recipe_names())} "
            f"(more through the entry point group {ENTRY_POINT_GROUP})"
        )
    if backend == "mcore" and data["precision"] not in MCORE_PRECISIONS:
        raise UsageError(
            f"recipe {name!r}: mcore precision must be one of {', '.join(MCORE_PRECISIONS)}"
        )
    values = {key: value for key, value in data.items() if key in _FIELDS}
    values["parallelism"] = dataclasses.asdict(Parallelism(**layout))
    recipe = Recipe.from_dict(
        {
            **{f.name: f.default for f in _FIELDS.values() if f.default is not dataclasses.MISSING},
            **values,
            "name": name,
            "backend_options": data.get(backend, {}),
        }
    )
    check_recipe(recipe)
    return recipe


def check_recipe(recipe: Recipe) -> None:
    """Sizes and layout: every product must divide the world, batches must split over data parallel."""
    where = f"recipe {recipe.name!r}"
    for key in (
        "nnodes",
        "nproc_per_node",
        "seq_length",
        "micro_batch_size",
        "global_batch_size",
        "train_iters",
    ):
        value = getattr(recipe, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{where}: {key} must be a positive integer, got {value!r}")
    check_layout(recipe.parallelism, recipe.world_size, where)
    layout = recipe.parallelism
    if recipe.backend == "mcore" and (layout.tp, layout.pp, layout.cp, layout.vpp) != (
        1,
        1,
        1,
        None,
    ):
        raise UsageError(
            f"{where}: the mcore back end's loop covers data and expert parallel only "
            "(TP, PP, CP must be 1; use the bridge back end)"
        )
    dp = recipe.parallelism.data_parallel(recipe.world_size)
    if recipe.global_batch_size % (recipe.micro_batch_size * dp):
        raise UsageError(
            f"{where}: global batch {recipe.global_batch_size} is not a multiple of micro batch "
            f"{recipe.micro_batch_size} x data parallel {dp}"
        )
    if recipe.stall_timeout_s >= recipe.timeout_s:
        # Collectives wait as long as the row may run (both back ends); a stall must be called first.
        raise UsageError(
            f"{where}: stall_timeout_s {recipe.stall_timeout_s:g} must be shorter than timeout_s "
            f"{recipe.timeout_s:g}"
        )
    first_allowance = recipe.first_iteration_timeout_s
    if first_allowance is not None and not 0 < first_allowance < recipe.timeout_s:
        raise UsageError(
            f"{where}: first_iteration_timeout_s {first_allowance:g} must be positive and shorter "
            f"than timeout_s {recipe.timeout_s:g}"
        )
    first, last = recipe.steady_window
    if not 1 <= first <= last <= recipe.train_iters:
        raise UsageError(
            f"{where}: steady_window [{first}, {last}] is not inside 1..{recipe.train_iters}"
        )
    if not recipe.rows or recipe.rows[0] != CONTROL_ROW:
        raise UsageError(f"{where}: rows must start with the matched [] control")
    for row in recipe.rows:
        RecomputeFields.parse(row)


def check_layout(layout: Parallelism, world: int, where: str) -> None:
    """The same divisibility MCore's ``initialize_model_parallel`` asserts, said on one line."""
    for key in PARALLEL_KEYS:
        value = getattr(layout, key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise UsageError(
                f"{where}: parallelism {key} must be a positive integer, got {value!r}"
            )
    dense = layout.tp * layout.pp * layout.cp
    if world % dense:
        raise UsageError(
            f"{where}: TP{layout.tp} x PP{layout.pp} x CP{layout.cp} = {dense} does not divide {world} ranks"
        )
    expert = layout.expert_tp * layout.ep * layout.pp
    if world % expert:
        raise UsageError(
            f"{where}: expert layout ETP{layout.expert_tp} x EP{layout.ep} x PP{layout.pp} = {expert} "
            f"does not divide {world} ranks"
        )
    if layout.vpp is not None and layout.pp == 1:
        raise UsageError(
            f"{where}: virtual pipeline (vpp={layout.vpp}) needs pipeline parallel > 1"
        )


def required_modules(recipe: Recipe) -> tuple[str, ...]:
    """The recipe's ``requires`` plus what its back end always imports, in order, once each."""
    return tuple(dict.fromkeys((*BACKEND_REQUIRES[recipe.backend], *recipe.requires)))


def check_packages(recipe: Recipe) -> None:
    """Refuse, before launching, a recipe whose packages this environment lacks or cannot import; every
    missing one is named, on one line."""
    modules = required_modules(recipe)
    missing = [module for module in modules if not importable(module)]
    if missing:
        hints = "; ".join(
            _INSTALL_HINT.get(module, f"install the package that provides {module}")
            for module in missing
        )
        which = "which is" if len(missing) == 1 else "which are"
        raise UsageError(
            f"recipe {recipe.name!r} needs {', '.join(missing)}, {which} not installed ({hints})"
        )
    failure = import_failure(modules) if recipe.device == "cuda" else None
    if failure is not None:
        module, reason = failure
        raise UsageError(
            f"recipe {recipe.name!r} needs {module}, which is installed but does not import: {reason}"
        )


def importable(module: str) -> bool:
    """Whether ``module`` is installed here (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_IMPORT_FAILED = "recompute-harness import failure"
_IMPORT_PROGRAM = f"""
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        print({_IMPORT_FAILED!r}, name, f"{{type(exc).__name__}}: {{exc}}".splitlines()[0], sep="\\t")
        break
"""


def import_failure(modules: Sequence[str], timeout_s: float = 300.0) -> tuple[str, str] | None:
    """The first of ``modules`` that fails to import, and the error; None when all import.

    Installed is not enough on GPU machines: a Transformer Engine built against another CUDA, or one
    that cannot find cuDNN, is found and then fails at import. The imports run in a child process so
    that the caller never starts CUDA (a context on GPU 0 would cost the ranks memory).
    """
    child = run_bounded([sys.executable, "-c", _IMPORT_PROGRAM, *modules], timeout_s=timeout_s)
    if child is None:
        return ", ".join(modules), f"importing did not finish in {timeout_s:.0f} s"
    failed = next(
        (line for line in child.stdout.splitlines() if line.startswith(_IMPORT_FAILED)), None
    )
    if failed is None:
        return (
            None
            if child.returncode == 0
            else (", ".join(modules), f"the import crashed (exit {child.returncode})")
        )
    _, module, reason = failed.split("\t", 2)
    return module, reason


def with_world(
    recipe: Recipe, *, nnodes: int | None = None, nproc_per_node: int | None = None
) -> Recipe:
    """The recipe on another world shape (``--nnodes``/``--nproc-per-node``), re-checked."""
    changed = dataclasses.replace(
        recipe,
        nnodes=recipe.nnodes if nnodes is None else nnodes,
        nproc_per_node=recipe.nproc_per_node if nproc_per_node is None else nproc_per_node,
    )
    check_recipe(changed)
    return changed
