"""Peaks over the step from torch's own MemTracker, on real MCore layers (dense-tiny, CPU, TP 1)."""

from __future__ import annotations

import pytest
import torch

from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state
from harness.models import build_model
from harness.probe.measurement.measure import Measurement, measure

ROWS = ("[]", "full-uniform-1")


@pytest.fixture(scope="module")
def measured() -> dict[str, tuple[torch.nn.Module, Measurement]]:
    init_cpu_parallel_state()
    out = {}
    for row in ROWS:
        model = build_model("dense-tiny", RecomputeFields.parse(row))
        out[row] = (model.module, measure(model))
    return out


@pytest.mark.parametrize("row", ROWS)
def test_forward_peak_holds_at_least_what_forward_retains(measured, row):
    """What autograd still holds when forward returns was alive at forward's peak too; no gradient
    or optimizer state exists yet (the step starts from zero_grad(set_to_none=True))."""
    _, result = measured[row]
    forward = result.peaks.forward
    assert forward.activation >= result.retained_bytes > 0
    assert forward.gradient == 0 and forward.optimizer_state == 0


def test_full_recompute_moves_the_peak_into_backward(measured):
    """Full recompute keeps only each layer's input in forward, and replays the layer in backward:
    its forward peak is far below []'s, and in backward more activations are alive at once than at
    the end of its own forward (the replayed layer), so its step peaks in backward, not in forward."""
    control, full = measured["[]"][1].peaks, measured["full-uniform-1"][1].peaks
    assert full.forward.step_bytes < control.forward.step_bytes / 2
    assert full.backward.activation > full.forward.activation
    assert full.backward.step_bytes > 2 * full.forward.step_bytes
    assert control.backward.step_bytes > full.backward.step_bytes  # still below []'s backward


def test_optimizer_phase_holds_every_gradient_and_adam_state(measured):
    module, result = measured["[]"]
    parameter_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    optimizer = result.peaks.optimizer
    assert optimizer.gradient == parameter_bytes  # every parameter of dense-tiny gets a gradient
    assert optimizer.optimizer_state >= 2 * parameter_bytes  # exp_avg + exp_avg_sq, fp32


def test_the_step_leaves_the_weights_as_built(measured):
    """The Adam step is undone: the probe's model keeps the weights every row shares."""
    module, _ = measured["[]"]
    built = build_model("dense-tiny", RecomputeFields.parse("[]")).module
    assert all(
        torch.equal(a, b) for a, b in zip(module.parameters(), built.parameters(), strict=True)
    )
    assert all(p.grad is None for p in module.parameters())


def test_per_module_peaks_name_every_layer_and_its_parts(measured):
    modules = measured["[]"][1].peaks.modules
    assert {"decoder.layers.0", "decoder.layers.1", "decoder.layers.0.mlp"} <= set(modules)
    # the second layer runs with the first layer's saved activations alive: its peaks are higher
    assert modules["decoder.layers.1"]["forward"] > modules["decoder.layers.0"]["forward"] > 0


def _tracked_step(tracker_class: type, row: str) -> tuple[dict, dict, dict]:
    """Forward + backward of a fresh dense-tiny ``row`` under ``tracker_class``: every module's
    snapshots and local peak by name, and the tracker's own peak and current snapshots."""
    init_cpu_parallel_state()
    model = build_model("dense-tiny", RecomputeFields.parse(row))
    batch = model.batch()
    tracker = tracker_class()
    tracker.track_external(model.module, *batch.values())
    with tracker:
        model.loss(batch).backward()
        peak, current = tracker.get_tracker_snapshot("peak"), tracker.get_tracker_snapshot()
    modules = {s.mod_fqn: (s.snapshots, s.local_peak) for s in tracker.memory_tracking.values()}
    return modules, peak, current


# Full recompute replays modules inside backward (MemTracker's AC region): the hardest case for an
# index of the active modules. Selective layernorm discards its output (CheckpointWithoutOutput
# resizes the storage to 0 and back): the tracker's resize updates.
@pytest.mark.parametrize("row", ["full-uniform-1", "layernorm"])
def test_the_indexed_tracker_records_exactly_what_memtracker_records(row):
    from torch.distributed._tools.mem_tracker import MemTracker

    from harness.probe.measurement import peaks

    tracker = peaks.memory_tracker()
    assert type(tracker) is peaks._IndexedMemTracker  # torch 2.14.1: the reviewed methods
    upstream = _tracked_step(MemTracker, row)
    indexed = _tracked_step(peaks._IndexedMemTracker, row)
    assert len(upstream[0]) > 20
    assert indexed == upstream


def test_the_optimizer_phase_is_measured_once_per_parameter_set_and_reused_exactly():
    from harness.probe.measurement import peaks

    init_cpu_parallel_state()
    control = build_model("dense-tiny", RecomputeFields.parse("[]"))
    full = build_model("dense-tiny", RecomputeFields.parse("full-uniform-1"))
    full.module.load_state_dict(control.module.state_dict())
    weights = [p.detach().clone() for p in control.module.parameters()]
    for model in (control, full):  # a first step builds what later steps reuse (rotary caches)
        peaks.measure_step_peaks(model)
    peaks._OPTIMIZER_SNAPSHOTS.clear()
    first = peaks.measure_step_peaks(control)
    reused = peaks.measure_step_peaks(full)  # another row of the model: the same set, reused
    assert len(peaks._OPTIMIZER_SNAPSHOTS) == 1
    peaks._OPTIMIZER_SNAPSHOTS.clear()
    fresh = peaks.measure_step_peaks(full)  # measured again from nothing
    assert reused.optimizer == fresh.optimizer and first.optimizer.optimizer_state > 0
    assert all(torch.equal(a, b) for a, b in zip(control.module.parameters(), weights, strict=True))
    # The set is read with the gradients backward left: without them it is another set.
    full.loss(full.batch()).backward()
    assert peaks._optimizer_inputs(full.module) in peaks._OPTIMIZER_SNAPSHOTS
    full.module.zero_grad(set_to_none=True)
    assert peaks._optimizer_inputs(full.module) not in peaks._OPTIMIZER_SNAPSHOTS
