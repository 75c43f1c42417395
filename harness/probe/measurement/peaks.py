"""Peaks over one training step, per phase (forward, backward, optimizer) and per module, from torch's
own memory tracker (``torch.distributed._tools.mem_tracker.MemTracker``), not a hand-written one.

The probe's retained bytes are what autograd holds at the end of forward; a GPU's peak is a moment of
the step, and recompute moves it: a checkpoint replays its forward inside backward, where the
replayed activations, the gradients of activations (temporaries) and the parameter gradients are
alive together. ``MemTracker`` sees every storage an op creates (and ``resize_``, so an output-discard
checkpoint's freed output counts as freed), and splits them into parameters, buffers, gradients,
activations, temporaries, optimizer state and other (the batch).

One step is measured from a reset RNG, after the probe's other measurements:

- **forward**: the tracker's peak when the loss is returned (forward is the step's first phase);
- **backward**: the root module's own backward peak (``Peak-Backward`` of the model);
- **optimizer**: ``torch.optim.Adam`` steps in a second tracker that knows the parameters, their
  gradients and the optimizer (its state and temporaries are created in the step); the activations and
  temporaries still alive when backward ended are added, as they are alive throughout the step.
  The step itself depends only on the parameters, buffers and gradients (names, shapes, dtypes,
  bytes), the same for every row of a model: it is measured once per such set and reused.

Per phase the figure is the bytes at that phase's peak that are not parameters, buffers or the batch
(activations + temporaries + gradients + optimizer state): what the step adds on top of the weights,
the quantity a GPU's allocated peak minus the model's weights reads. The breakdown is kept beside it.
Per module (decoder layers and their direct children): the activation + temporary bytes at that
module's own forward and backward peaks (the largest over its calls).

The weights are copied back after the optimizer step, so the probe's model is left as it was built.

``memory_tracker()`` is the tracker every measurement uses: on the reviewed torch, one whose per-op
peak update visits the active modules by name instead of walking every tracked module, whose
snapshots are two-level copies instead of deep copies, and which tracks an operator's outputs without
rebuilding them, and which skips a per-op update that could change nothing (the same statistics,
updated the same way; the walk was half of a probe pass, the deep copies a third of what was left of
the peak step, the rebuilt outputs a third of the rest, the skipped updates a tenth of what was left,
the pre hooks' deep copies a fifth of what was left then).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import torch
from torch._guards import active_fake_mode
from torch.distributed._tools import mem_tracker
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState
from torch.distributed._tools.mod_tracker import ModTracker
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_iter, tree_map_only

from harness.cpu.adapter import reseed, source_digest
from harness.models import TinyModel

PHASES = ("forward", "backward", "optimizer")
# MemTracker's categories (its ``_MemRefType`` values), and the ones that are not the step's own.
PARAMETER, BUFFER, GRADIENT = "Parameter", "Buffer", "Gradient"
ACTIVATION, TEMPORARY, OPTIMIZER_STATE, OTHER = "Activation", "Temp", "Optstate", "Other"
_NOT_THE_STEPS = (PARAMETER, BUFFER, OTHER)
_PEAK_FORWARD, _PEAK_BACKWARD = "Peak-Forward", "Peak-Backward"
_TOTAL = "Total"  # MemTracker's per-device total key (its _TOTAL_KEY)
_MODULE_DEPTH = 4  # decoder.layers.<i>.<child>: per layer and per layer part
_CPU = torch.device("cpu")


def _without_no_grad_views(arg: torch.Tensor) -> torch.Tensor:
    # A view made in no-grad mode of a tensor that requires grad says requires_grad but has no
    # gradient edge: torch's ModTracker asserts on it ("Expected gradient function to be set"). No
    # gradient can reach it, so a backward hook on it could never fire; detached, the tracker sees
    # the same storage and hooks the module's other inputs.
    if arg.requires_grad and arg.grad_fn is None and arg._is_view():
        return arg.detach()
    return arg


class _ModTracker(ModTracker):
    """torch's module tracker, told of a module's inputs without no-grad views: MCore's Gated DeltaNet
    reshapes inside its output-discard checkpoint's forward (no-grad) before calling its norm."""

    def _fw_pre_hook(self, mod: torch.nn.Module, input: object) -> None:
        super()._fw_pre_hook(mod, tree_map_only(torch.Tensor, _without_no_grad_views, input))


class _MemTracker(MemTracker):
    def __init__(self) -> None:
        super().__init__()
        self._mod_tracker = _ModTracker()


@dataclass(frozen=True)
class PhasePeak:
    """The tracker's snapshot at one phase's peak: bytes per category, and the step's own total."""

    activation: int
    temporary: int
    gradient: int
    optimizer_state: int

    @property
    def step_bytes(self) -> int:
        return self.activation + self.temporary + self.gradient + self.optimizer_state


@dataclass(frozen=True)
class StepPeaks:
    forward: PhasePeak
    backward: PhasePeak
    optimizer: PhasePeak
    # module path -> {"forward": bytes, "backward": bytes}: activations + temporaries at its own peaks
    modules: dict[str, dict[str, int]] = field(default_factory=dict)

    def phase(self, name: str) -> PhasePeak:
        return getattr(self, name)

    def as_dict(self) -> dict[str, object]:
        return {
            **{
                name: {**asdict(self.phase(name)), "step_bytes": self.phase(name).step_bytes}
                for name in PHASES
            },
            "modules": self.modules,
        }


# MemTracker methods ``_IndexedMemTracker`` builds on, as reviewed (sha256[:16] of their source). Any
# other torch gets MemTracker as it is: slower, never different.
_REVIEWED_MEMTRACKER = {
    "_update_peak_stats": "19ad36727caf6fd2",  # torch 2.14.1
    "_pre_fw_hook": "c03814b427a32ecc",
    "get_tracker_snapshot": "2c0129f26357895b",
    "__torch_dispatch__": "cda57a572a86648d",
    # Where a module's local peak is reset (pre hooks) and what the post hooks leave alone: the
    # update skip below rests on them, and on when ModTracker adds a module to ``parents``.
    "_pre_bw_hook": "d5740987fe474607",
    "_post_fw_hook": "baccba3c4085eb7f",
    "_post_bw_hook": "4c488ea31f420d98",
    "_update_snap": "a1d6221d03ebe9cb",  # reads ``_ref_class``: nothing else in its module does
}
_REVIEWED_MODTRACKER = {"_get_append_fn": "a17818acdc08fb11", "_fw_pre_hook": "62dddd92d2879b22"}


class _Snapshot(dict):
    """A tracker snapshot, ``{device: {category: bytes}}``, whose deep copy copies its two levels:
    the pre hooks deep-copy every snapshot they take (a fifth of the peak step, measured); devices,
    enum members and ints are their own deep copies, so it is the same value."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _Snapshot:
        return _Snapshot({device: dict(snapshot) for device, snapshot in self.items()})


class _IndexedMemTracker(_MemTracker):
    """``MemTracker`` whose per-operator peak update visits the active modules through an index by
    name, whose snapshots are plain two-level copies, and whose per-operator tracking visits the
    output's tensors without rebuilding the output.

    Upstream's ``_update_peak_stats`` walks every tracked module (a weak dictionary) after every
    operator to find those whose name is among ``_mod_tracker.parents``; each module's update reads
    only its own statistics and the current snapshot, so visiting just those modules, in any order,
    updates exactly what upstream updates. The index is rebuilt after a module is first tracked or
    renamed (both happen in ``_pre_fw_hook``); a dead module's stale entry is updated by nobody's
    reading (it has left ``memory_tracking``).

    Upstream's ``__torch_dispatch__`` tracks an operator's outputs with ``tree_map_only``, which
    rebuilds the output's structure only to discard it: a third of the peak step. Visiting the same
    leaves in the same (flattening) order calls ``_track`` exactly as upstream does.

    An update after which no total rose is skipped: an update leaves every active module's local peak
    and the tracker's own peak at least at the totals it saw, and between two module hooks nothing
    lowers a local peak (only the pre hooks reset one) or adds an active module (ModTracker adds one
    to ``parents`` just before calling a pre hook; leaving only narrows the update), so an update of
    the same state whose totals are none above the last's would change nothing. More than half of a
    step's updates (an operator that returns a view or frees as much as it allocates)."""

    _stats_by_fqn: dict[str, list[Any]] | None = None
    # (peak state, per-device totals) of the last update; None after a hook may have changed a peak
    _last_update: tuple[Any, dict[torch.device, int]] | None = None

    def __init__(self) -> None:
        super().__init__()
        # Upstream's ``_update_snap``, its one reader, makes ``dict.fromkeys(self._ref_class, 0)`` for
        # every tracked storage; iterating the enum class each time was ~14 % of the peak step. Its
        # members as a tuple give the same dict (an Enum iterates its members in definition order).
        self._ref_class = tuple(_MemRefType)

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        self._last_update = None
        known = self.memory_tracking.get(module)
        name = None if known is None else known.mod_fqn
        super()._pre_fw_hook(module, inputs)
        if known is None or self.memory_tracking[module].mod_fqn != name:
            self._stats_by_fqn = None

    def _pre_bw_hook(self, module: torch.nn.Module, args: Any) -> None:
        self._last_update = None
        super()._pre_bw_hook(module, args)

    def get_tracker_snapshot(self, type: str = "current") -> dict[torch.device, dict[str, int]]:
        # Upstream deep-copies the {device: {category: bytes}} snapshot, and every module hook takes
        # one: a third of a probe's peak step went to ``copy.deepcopy``. Its keys are devices and
        # enum members and its values ints, so copying both levels gives the same value.
        snapshots = {"current": self._curr_mem_snap, "peak": self._peak_mem_snap}
        if type not in snapshots:
            return super().get_tracker_snapshot(type)
        return _Snapshot({device: dict(snapshot) for device, snapshot in snapshots[type].items()})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Upstream's steps, in its order; only the tracking of the outputs differs (see above).
        if any(t == DTensor for t in types):
            return NotImplemented
        if func is torch.ops._c10d_functional.wait_tensor.default and active_fake_mode():
            result = args[0]
        else:
            result = func(*args, **kwargs or {})
        if active_fake_mode() is self._fake_mode_on_entry:
            if self._in_opt:
                reftype = _MemRefType.OPT
            elif self._mod_tracker.is_bw and not self._in_ac:
                reftype = _MemRefType.TEMP
            else:
                reftype = _MemRefType.ACT
            if isinstance(result, torch.Tensor):
                self._track(reftype, result)
            else:
                for leaf in tree_iter(result):
                    if isinstance(leaf, torch.Tensor):
                        self._track(reftype, leaf)
            self._update_peak_stats(
                _ModState.PEAK_BW if self._mod_tracker.is_bw else _ModState.PEAK_FW
            )
        return result

    def _update_peak_stats(self, peak_state: Any) -> None:
        current = self._curr_mem_snap
        last = self._last_update
        if (
            last is not None
            and last[0] == peak_state
            and all(
                snapshot[_TOTAL] <= last[1].get(device, -1) for device, snapshot in current.items()
            )
        ):
            return
        self._last_update = (
            peak_state,
            {device: snapshot[_TOTAL] for device, snapshot in current.items()},
        )
        if self._stats_by_fqn is None:
            self._stats_by_fqn = {}
            for stats in self.memory_tracking.values():
                self._stats_by_fqn.setdefault(stats.mod_fqn, []).append(stats)
        for name in self._mod_tracker.parents:
            for stats in self._stats_by_fqn.get(name, ()):
                if peak_state not in stats.snapshots:
                    continue
                for device, snapshot in current.items():
                    if stats.local_peak.get(device, 0) < snapshot[_TOTAL]:
                        stats.local_peak[device] = snapshot[_TOTAL]
                        stats.snapshots[peak_state][-1][device] = dict(snapshot)
        for device, snapshot in current.items():
            if self._peak_mem.get(device, 0) < snapshot[_TOTAL]:
                self._peak_mem[device] = snapshot[_TOTAL]
                self._peak_mem_snap[device] = dict(snapshot)


@cache
def _memtracker_is_reviewed() -> bool:
    if inspect.getsource(mem_tracker).count("_ref_class") != 2:  # set in __init__, read once
        return False
    return all(
        source_digest(getattr(tracker, method)) == digest
        for tracker, reviewed in (
            (MemTracker, _REVIEWED_MEMTRACKER),
            (ModTracker, _REVIEWED_MODTRACKER),
        )
        for method, digest in reviewed.items()
    )


def memory_tracker() -> MemTracker:
    """A fresh tracker: the indexed one where torch's methods are the reviewed ones."""
    return _IndexedMemTracker() if _memtracker_is_reviewed() else _MemTracker()


def _phase_peak(snapshot: dict[str, int], carried: PhasePeak | None = None) -> PhasePeak:
    extra = carried or PhasePeak(0, 0, 0, 0)
    return PhasePeak(
        activation=snapshot.get(ACTIVATION, 0) + extra.activation,
        temporary=snapshot.get(TEMPORARY, 0) + extra.temporary,
        gradient=snapshot.get(GRADIENT, 0),
        optimizer_state=snapshot.get(OPTIMIZER_STATE, 0),
    )


def _on_cpu(snapshot: dict[torch.device, dict[str, int]]) -> dict[str, int]:
    # Keys are MemTracker's ``_MemRefType`` members (str enums) plus its plain "Total".
    return {getattr(key, "value", key): value for key, value in snapshot.get(_CPU, {}).items()}


def live_activation_bytes(snapshot: dict[torch.device, dict[str, int]]) -> int:
    """Activation + temporary bytes on the CPU in a MemTracker snapshot."""
    cpu = _on_cpu(snapshot)
    return cpu.get(ACTIVATION, 0) + cpu.get(TEMPORARY, 0)


def _module_peaks(tracker: MemTracker, root: torch.nn.Module) -> dict[str, dict[str, int]]:
    """Activation + temporary bytes at each module's own forward / backward peak (largest call)."""
    root_name = tracker.memory_tracking[root].mod_fqn
    peaks: dict[str, dict[str, int]] = {}
    for stats in tracker.memory_tracking.values():
        if not stats.mod_fqn.startswith(f"{root_name}."):
            continue
        name = stats.mod_fqn[len(root_name) + 1 :]
        if name.count(".") >= _MODULE_DEPTH or not name.startswith("decoder.layers."):
            continue
        peaks[name] = {
            phase: max(
                (live_activation_bytes(snapshot) for snapshot in stats.snapshots.get(state, [])),
                default=0,
            )
            for phase, state in (("forward", _PEAK_FORWARD), ("backward", _PEAK_BACKWARD))
        }
    return dict(sorted(peaks.items()))


# The optimizer step's own snapshot at its peak, by what decides it: the parameters, buffers and
# gradients (names, shapes, dtypes, bytes). A fresh Adam's first step allocates its state and
# temporaries from those alone, so every row of a model reads the same snapshot; only the activations
# a row leaves alive after backward differ, and they are added per row (``still_alive``).
_OPTIMIZER_SNAPSHOTS: dict[tuple[object, ...], dict[str, int]] = {}


def _optimizer_inputs(module: torch.nn.Module) -> tuple[object, ...]:
    def signature(tensor: torch.Tensor | None) -> object:
        if tensor is None:
            return None
        return (tuple(tensor.shape), tensor.dtype, tensor.untyped_storage().nbytes())

    return (
        tuple((name, signature(p), signature(p.grad)) for name, p in module.named_parameters()),
        tuple((name, signature(b)) for name, b in module.named_buffers()),
    )


def _optimizer_snapshot(module: torch.nn.Module) -> dict[str, int]:
    """The snapshot at the peak of one ``torch.optim.Adam`` step of ``module``, in a tracker that
    knows the parameters, their gradients and the optimizer; the weights are restored after it."""
    key = _optimizer_inputs(module)
    if key not in _OPTIMIZER_SNAPSHOTS:
        weights = [parameter.detach().clone() for parameter in module.parameters()]
        optimizer = torch.optim.Adam(module.parameters())
        step = memory_tracker()
        step.track_external(module, optimizer)
        with step:
            optimizer.step()
        _OPTIMIZER_SNAPSHOTS[key] = _on_cpu(step.get_tracker_snapshot("peak"))
        with torch.no_grad():
            for parameter, weight in zip(module.parameters(), weights, strict=True):
                parameter.copy_(weight)
    return _OPTIMIZER_SNAPSHOTS[key]


def measure_step_peaks(model: TinyModel, *, seed: int = 1234) -> StepPeaks:
    """One forward + backward + Adam step of ``model`` under ``MemTracker``; the weights are restored."""
    module = model.module
    module.train()
    module.zero_grad(set_to_none=True)
    batch = model.batch()
    tracker = memory_tracker()
    tracker.track_external(module, *batch.values())
    reseed(seed)
    # ModTracker warns "Module is None. Skipping PRE_BW hook" for each backward hook whose module
    # died before backward reached it: the torch.nn.Softmax that unfused core attention builds and
    # drops inside its forward (checked: the only one). The model's own modules are all tracked; the
    # warning was most of a probe's stderr.
    with tracker, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Module is None. Skipping", UserWarning)
        loss = model.loss(batch)
        forward = _phase_peak(_on_cpu(tracker.get_tracker_snapshot("peak")))
        loss.backward()
        after_backward = _on_cpu(tracker.get_tracker_snapshot("current"))
    backward = _phase_peak(_on_cpu(tracker.memory_tracking[module].snapshots[_PEAK_BACKWARD][-1]))
    modules = _module_peaks(tracker, module)
    still_alive = PhasePeak(
        after_backward.get(ACTIVATION, 0), after_backward.get(TEMPORARY, 0), 0, 0
    )
    optimizer_peak = _phase_peak(_optimizer_snapshot(module), still_alive)
    module.zero_grad(set_to_none=True)
    return StepPeaks(forward, backward, optimizer_peak, modules)
