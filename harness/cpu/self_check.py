"""The CPU adapter's behavioural self-check: run on every revision before any verdict.

The adapter replaces a few CUDA-only helpers (``harness.cpu.adapter``) and runs everything else of
Megatron Core as it is, including every checkpoint class and every caller of the RNG tracker. Whether
the adapter still means what it claims on the revision at hand is therefore checked by behaviour, not
by source text:

1. RNG state (the adapter's part 2): the state ``_get_cuda_rng_state`` saves, restored by
   ``_set_cuda_rng_state``, replays the same dropout mask, inside the RNG tracker's fork and outside
   it, and ``torch.cuda.get_rng_state`` / ``manual_seed`` are the generator dropout draws from. A
   broken CPU RNG state (the tracker's generator not being the one dropout draws from) replays other
   masks.
2. Transformer Engine names: every global name that the output-discard path's code objects look up
   (``CheckpointWithoutOutput*`` and the module functions and classes they reach, transitively) is
   bound, in the module or builtins, or bound by the adapter (``FP8_DISABLED_NAMES``). An unbound one
   would raise ``NameError`` mid-probe; it is named with the code that reaches it.
3. Collectives let go of their tensors before they return (the adapter's part 9): no Megatron Core
   module global still names one of torch's own collectives, and all-reduces on the gloo group leave
   their tensor with the reference count it had. A step's tensor held by gloo past the call would be
   counted at a phase's peak by the machine's load.
4. TE's grouped linear (the adapter's part 10, where bound): the CPU stand-ins compute per-expert
   ``F.linear`` and its gradients, and every tensor they save for their input is a view of the
   caller's storage, as TE's ``_GroupedLinear`` saves it (``harness.cpu.grouped_linear``).

Megatron Core's own checkpoint classes are not the adapter's: ``checkpoint_findings()`` runs them
under dropout (``CheckpointFunction`` and ``CheckpointWithoutOutput`` against plain autograd, bitwise;
the latter's output really freed) and returns what misbehaves, with the labels that rely on it. That
is a finding of the probe (judged, exit 1), never a refusal: it is what the harness exists to catch.

``self_check_problems()`` returns one line per failure of the adapter (empty: it works here).
"""

from __future__ import annotations

import ast
import builtins
import dis
import importlib
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from megatron.core.tensor_parallel import random as mcore_random

from harness.config.label_facts import labels_relying_on
from harness.config.revisions import collect_revisions
from harness.cpu.adapter import (
    GROUPED_LINEAR_SPEC_MODULE,
    GROUPED_LINEAR_STAND_INS,
    init_cpu_parallel_state,
    replaced_drift,
    reseed,
    unsettled_megatron_globals,
)
from harness.cpu.grouped_linear import CpuGroupedLinear
from harness.errors import UsageError

# Entry points of the output-discard path; absent ones (older revisions) are skipped.
OUTPUT_DISCARD_CLASSES = (
    "CheckpointWithoutOutput",
    "CheckpointWithoutOutputFunction",
    "CheckpointWithoutOutputManager",
)
_SEED = 4321
_DROPOUT = 0.5


def _functions_of(owner: Any, qualname: str) -> Iterator[tuple[str, types.FunctionType]]:
    """(qualified name, function) of a module-level function or of every method of a class, with
    decorators' wrappers (``contextlib.contextmanager``) unwrapped to the code that was written."""
    members = (
        [("", owner)]
        if isinstance(owner, types.FunctionType)
        else [(f".{name}", member) for name, member in vars(owner).items()]
    )
    for suffix, member in members:
        member = getattr(member, "__func__", member)  # staticmethod / classmethod
        if isinstance(member, property):
            member = member.fget
        if callable(member):
            member = inspect.unwrap(member)
        if isinstance(member, types.FunctionType):
            yield f"{qualname}{suffix}", member


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def _global_lookups(function: types.FunctionType) -> set[str]:
    return {
        instruction.argval
        for code in _code_objects(function.__code__)
        for instruction in dis.get_instructions(code)
        if instruction.opname == "LOAD_GLOBAL"
    }


def _te_imports(module: types.ModuleType) -> set[str]:
    """Names the module imports from ``transformer_engine`` (bound only when TE is installed)."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return set()
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_engine")
        for alias in node.names
    }


def unbound_output_discard_names(
    module: types.ModuleType = mcore_random,
) -> dict[str, list[str]]:
    """Global names the output-discard path looks up that nothing binds: name -> the code reaching it."""
    namespace = vars(module)
    pending = [(name, namespace[name]) for name in OUTPUT_DISCARD_CLASSES if name in namespace]
    seen: set[int] = set()
    unbound: dict[str, list[str]] = {}
    while pending:
        qualname, owner = pending.pop()
        if id(owner) in seen:
            continue
        seen.add(id(owner))
        for where, function in _functions_of(owner, qualname):
            if function.__globals__ is not namespace:
                continue  # another module's code (torch, contextlib): not this path's names
            for name in sorted(_global_lookups(function)):
                if name in namespace:
                    value = namespace[name]
                    defined_here = getattr(value, "__module__", None) == module.__name__
                    if defined_here and isinstance(value, type | types.FunctionType):
                        pending.append((name, value))
                elif not hasattr(builtins, name):
                    unbound.setdefault(name, []).append(where)
    return unbound


def _dropout_block(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Dropout drawn from the tracker's stream and from the default one: replay must restore both."""
    with mcore_random.get_cuda_rng_tracker().fork():
        inner = torch.nn.functional.dropout(x @ weight, _DROPOUT, training=True)
    return torch.tanh(inner) * torch.nn.functional.dropout(x, _DROPOUT, training=True)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(_SEED)
    x = torch.randn(8, 16, generator=generator, requires_grad=True)
    weight = torch.randn(16, 16, generator=generator, requires_grad=True)
    return x, weight


def _run(forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
    """Output and input gradients of ``(forward(x, w) ** 2).sum()``, from a fixed RNG state; a draw
    between forward and backward moves the generators on, so only a real replay finds the masks."""
    x, weight = _inputs()
    reseed(_SEED)
    out = forward(x, weight)
    torch.nn.functional.dropout(torch.ones(64), _DROPOUT, training=True)
    with mcore_random.get_cuda_rng_tracker().fork():
        torch.nn.functional.dropout(torch.ones(64), _DROPOUT, training=True)
    loss = (out * out).sum()
    hook = getattr(forward, "hook", None)
    if hook is not None:
        hook(loss)
    loss.backward()
    return [loss.detach(), x.grad, weight.grad]


class _OutputDiscard:
    """``CheckpointWithoutOutput`` used as MCore's layers use it: checkpoint, then discard the output
    once the loss that consumes it exists (the recompute hook on the loss restores it)."""

    def __init__(self) -> None:
        self.checkpoint = mcore_random.CheckpointWithoutOutput()
        self.output: torch.Tensor | None = None
        self.discarded = False

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        self.output = self.checkpoint.checkpoint(_dropout_block, x, weight)
        return self.output

    def hook(self, loss: torch.Tensor) -> None:
        self.checkpoint.discard_output_and_register_recompute(loss)
        self.discarded = self.output is not None and self.output.untyped_storage().nbytes() == 0


def rng_problems() -> list[str]:
    """Check 1: one line per way the adapter's RNG state is not the generator dropout draws from."""
    problems = []
    ones = torch.ones(256)

    def draw() -> torch.Tensor:
        return torch.nn.functional.dropout(ones, _DROPOUT, training=True)

    reseed(_SEED)
    state = mcore_random._get_cuda_rng_state()
    first = draw()
    mcore_random._set_cuda_rng_state(state)
    if not torch.equal(first, draw()):
        problems.append(
            "the RNG state _get_cuda_rng_state saves, restored by _set_cuda_rng_state, does not "
            "replay a dropout mask"
        )
    tracker = mcore_random.get_cuda_rng_tracker()
    states = tracker.get_states()
    with tracker.fork():
        first = draw()
    tracker.set_states(states)
    with tracker.fork():
        if not torch.equal(first, draw()):
            problems.append("the RNG tracker's restored state does not replay a dropout mask")
    torch.cuda.manual_seed(_SEED)
    seeded = draw()
    torch.manual_seed(_SEED)
    if not torch.equal(seeded, draw()):
        problems.append("torch.cuda.manual_seed does not seed the generator dropout draws from")
    return problems


@dataclass(frozen=True)
class CheckpointFinding:
    """Megatron Core's own checkpoint class misbehaving under dropout, and the labels relying on it."""

    checkpoint: str
    problem: str
    labels: tuple[str, ...]

    def line(self) -> str:
        return (
            f"Megatron Core's {self.problem}; the rows relying on {self.checkpoint}: "
            f"{', '.join(self.labels)}"
        )


def checkpoint_findings() -> list[CheckpointFinding]:
    """Megatron Core's ``CheckpointFunction`` and ``CheckpointWithoutOutput`` run under dropout:
    each that does not replay bitwise plain autograd's loss and gradients, or (the latter) keeps its
    output's storage, with the labels relying on it. The code under test: judged, never refused."""
    expected = _run(_dropout_block)
    findings = []
    output_discard = _OutputDiscard()
    for name, forward in (
        (
            "CheckpointFunction",
            lambda x, w: mcore_random.checkpoint(_dropout_block, False, x, w),
        ),
        ("CheckpointWithoutOutput", output_discard),
    ):
        try:
            actual = _run(forward)
        except Exception as exc:  # noqa: BLE001 - any failure of the real checkpoint is the verdict
            problem = f"{name} raised under dropout: {type(exc).__name__}: {exc}"
            findings.append(CheckpointFinding(name, problem, labels_relying_on(name)))
            continue
        differing = [
            what
            for what, a, b in zip(
                ("the loss", "grad x", "grad weight"), expected, actual, strict=True
            )
            if b is None or not torch.equal(a, b)
        ]
        if differing:
            problem = f"{name} does not replay dropout bitwise (differs in {', '.join(differing)})"
            findings.append(CheckpointFinding(name, problem, labels_relying_on(name)))
    if not output_discard.discarded:
        name = "CheckpointWithoutOutput"
        if not any(finding.checkpoint == name for finding in findings):
            problem = f"{name} kept its output's storage (no discard happened)"
            findings.append(CheckpointFinding(name, problem, labels_relying_on(name)))
    return findings


def _config_for_stand_ins() -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)


def saved_input_problems(linear_class: type[CpuGroupedLinear] | Any) -> list[str]:
    """Check 4 for one grouped-linear class: per-expert ``F.linear`` and its gradients, and every
    saved tensor that is not a parameter a view of the caller's input storage (TE's non-FP8 path)."""
    generator = torch.Generator().manual_seed(_SEED)
    config = _config_for_stand_ins()
    linear = linear_class(
        3,
        8,
        6,
        config=config,
        init_method=lambda w: torch.nn.init.normal_(w, generator=generator),
        bias=False,
        skip_bias_add=False,
        is_expert=True,
    )
    name = linear_class.__name__
    splits = [2, 0, 3]
    x = torch.randn(sum(splits), linear.in_features, generator=generator, requires_grad=True)
    parameters = {id(p) for p in linear.parameters()}
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out, _ = linear(x, splits)
    problems = []
    activations = [t for t in saved if id(t) not in parameters and t.numel()]
    foreign = [
        tuple(t.shape)
        for t in activations
        if t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    ]
    if foreign:
        problems.append(
            f"{name} saves {len(foreign)} tensor(s) {foreign} that are not views of its input: "
            "TE's GroupedLinear saves the per-expert views (an output-discard checkpoint frees them)"
        )
    weights = [getattr(linear, f"weight{i}") for i in range(linear.num_gemms)]
    expected = torch.cat(
        [torch.nn.functional.linear(part, w) for part, w in zip(x.split(splits), weights)]
    )
    (out * out).sum().backward()
    grads = [x.grad, *(w.grad for w in weights)]
    x_ref = x.detach().clone().requires_grad_(True)
    weights_ref = [w.detach().clone().requires_grad_(True) for w in weights]
    reference = torch.cat(
        [torch.nn.functional.linear(p, w) for p, w in zip(x_ref.split(splits), weights_ref)]
    )
    (reference * reference).sum().backward()
    if not torch.allclose(out, expected) or not all(
        g is not None and torch.allclose(g, r.grad)
        for g, r in zip(grads, [x_ref, *weights_ref], strict=True)
    ):
        problems.append(f"{name} does not compute per-expert F.linear and its gradients")
    return problems


def grouped_linear_problems() -> list[str]:
    """Check 4: the stand-ins the adapter bound (none where TE is installed)."""
    provider = importlib.import_module(GROUPED_LINEAR_SPEC_MODULE)
    return [
        problem
        for name, stand_in in GROUPED_LINEAR_STAND_INS.items()
        if getattr(provider, name, None) is stand_in
        for problem in saved_input_problems(stand_in)
    ]


def collective_problems(calls: int = 200) -> list[str]:
    """Check 3: one line per Megatron Core global bound to an unsettled collective, or one line if
    any of ``calls`` all-reduces returned while gloo still held its tensor."""
    problems = [
        f"{module}.{key} is torch's own {name}, which returns before gloo lets go of its tensors"
        for module, key, name in unsettled_megatron_globals()
    ]
    held = 0
    for _ in range(calls):
        tensor = torch.zeros(32, 2)
        before = tensor._use_count()
        torch.distributed.all_reduce(tensor)
        held += tensor._use_count() != before
    if held:
        problems.append(f"{held} of {calls} all-reduces returned while gloo still held the tensor")
    return problems


def self_check_problems() -> list[str]:
    """Every way the adapter fails on this revision, one line each (empty: it works here)."""
    te_names = _te_imports(mcore_random)
    problems = [
        f"the CPU adapter does not bind {name}"
        + (" (a Transformer Engine name)" if name in te_names else "")
        + f", which {', '.join(sorted(set(where)))} looks up in {mcore_random.__name__}"
        for name, where in sorted(unbound_output_discard_names().items())
    ]
    return problems or rng_problems() + collective_problems() + grouped_linear_problems()


def require_working_adapter(action: str) -> list[str]:
    """Run the self-check on this revision; raise ``UsageError`` (exit 2, one line) when it fails.
    Returns ``replaced_drift()``: reported, not refused. ``action`` says what a failure refuses."""
    init_cpu_parallel_state()
    problems = self_check_problems()
    if problems:
        mcore = collect_revisions()["megatron_core"] or {}
        raise UsageError(
            f"refusing to {action}: the CPU adapter fails its self-check on megatron-core "
            f"{mcore.get('version')} (fingerprint {mcore.get('fingerprint')}): {'; '.join(problems)}"
        )
    return replaced_drift()
