"""Worker-side instrumentation shared by both back ends: phases, per-iteration peaks, errors, faults.

Per iteration it costs one flushed JSON line per phase plus one for the iteration, four reads of
the CUDA caching allocator's counters (``max_memory_allocated``/``max_memory_reserved`` at the
iteration's start, before ``reset_peak_memory_stats``, and at its end; host-side, no device sync: the
iteration's own peak and the run's high-water mark, ``PeakTracker``), ``memory_allocated()`` after the optimizer step and after zero_grad (memory carried
into the next iteration), and one ``torch.cuda.mem_get_info()`` (the driver's free/total of the whole device:
what the allocator does not see — the CUDA context, NCCL's and DeepEP/HybridEP's buffers). Phases
are marked on the host; an OOM is raised on the host by the allocating call, so the phase it is
reported in is the one that allocated. On CPU there is no caching allocator and so no allocator
peak: peaks are reported as ``None`` and the record says so.

A failure is reported once, as early as possible: ``reporting_unwind`` writes the error line when
the exception leaves a given upstream function, before the upstream caller's own clean-up (Bridge's
``_pretrain`` destroys its global state and aborts its process groups, which can hang) runs.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.run.events import EventWriter
from harness.run.faults import LOSS_KINDS, fault_from_env


class NonFiniteLoss(FloatingPointError):
    """The world-reduced loss is NaN/inf; ``local_finite`` says whether this rank's own loss was.

    The loss is made in ``forward`` (``phase``) even when the check reads it later (once per step)."""

    def __init__(self, iteration: int, reduced: float, local: float) -> None:
        super().__init__(
            f"non-finite loss at iteration {iteration}: reduced {reduced}, this rank {local}"
        )
        self.local_finite = math.isfinite(local)
        self.iteration = iteration
        self.phase = "forward"


# (allocated high-water, reserved high-water, device used, this iteration's allocated and reserved peaks)
MemoryReading = tuple[int | None, int | None, int | None, int | None, int | None]


class PeakTracker:
    """The run's allocator high-water marks, kept on the rank across the per-iteration resets of the
    allocator's peak statistics (a reset forgets them): the maximum of every peak read so far."""

    def __init__(self) -> None:
        self.allocated = 0
        self.reserved = 0

    def fold(self, allocated: int, reserved: int) -> tuple[int, int]:
        """Take in peaks read since the last reset; the high-water marks through them."""
        self.allocated = max(self.allocated, allocated)
        self.reserved = max(self.reserved, reserved)
        return self.allocated, self.reserved


class Instrument:
    """One rank's reporter: phase marks, iterations, notes and errors as event lines, plus the fault hook."""

    def __init__(self, row_dir: Path, rank: int, device: str) -> None:
        self.rank = rank
        self.device = device
        self.fault = fault_from_env()  # None unless the runner handed this row a fault
        self.events = EventWriter(row_dir, rank)
        self.iteration = 0
        self.phase_name: str | None = None
        self.device_named = False
        self._reported: BaseException | None = None
        self.allocated: dict[
            str, int
        ] = {}  # memory_allocated() read this iteration, emitted at its end
        self.high_water = PeakTracker()
        self.peaks_reset_for = 0  # the iteration whose start last reset the allocator's peaks

    def started(self, world_size: int) -> None:
        """Announce this rank. No CUDA call here: CUDA reads some settings once, when it initialises
        (the allocator's ``PYTORCH_CUDA_ALLOC_CONF``), and a back end may still have to set them."""
        self.events.emit(
            "start",
            rank=self.rank,
            world_size=world_size,
            pid=os.getpid(),
            host=socket.gethostname(),
            device=self.device,
        )

    def device_ready(self) -> None:
        """Name this rank's GPU; back ends call it once they have set CUDA up (nothing on CPU)."""
        if self.device != "cuda":
            return
        import torch

        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.events.emit(
            "device", name=properties.name, sm=f"{properties.major}.{properties.minor}"
        )
        self.device_named = True

    def enter(self, iteration: int, name: str) -> None:
        """Mark the start of a phase (and give the fault hook its chance to fire there)."""
        if iteration >= 1 and iteration != self.peaks_reset_for:
            self.reset_peaks(iteration)
        self.iteration, self.phase_name = iteration, name
        self.events.emit("phase", iteration=iteration, phase=name)
        if (
            self.fault is not None
            and self.fault.kind not in LOSS_KINDS
            and self.fault.fires(iteration, name, self.rank)
        ):
            self.fault_fired()
            self.fault.at_phase_start(iteration, name, self.rank)

    def fault_fired(self) -> None:
        """Said before the fault acts: a fault that never fires must not let its row pass (runner)."""
        self.events.emit("fault", spec=self.fault.spec() if self.fault is not None else None)

    @contextlib.contextmanager
    def phase(self, iteration: int, name: str) -> Iterator[None]:
        self.enter(iteration, name)
        yield

    def revisions(self, revisions: dict[str, Any]) -> None:
        """The stack this rank runs on (``collect_revisions()`` here): the record's pins come from the ranks."""
        self.events.emit("revisions", revisions=revisions)

    def environment(self, values: dict[str, str]) -> None:
        """The recorded variables (``harness.run.environment``) as this rank runs with them; the last
        report wins (a back end that applies its recipe's defaults reports again after them)."""
        self.events.emit("environment", values=values)

    def note(self, key: str, value: str) -> None:
        """A fact about how the workload actually ran (e.g. a dispatcher fallback), kept in the record."""
        self.events.emit("note", key=key, value=value)

    def loss(self, loss: Any, iteration: int) -> Any:
        """The fault hook's chance to poison this rank's loss (identity unless a nan/inf fault is set)."""
        if self.fault is None or not self.fault.poisons(iteration, self.rank):
            return loss
        self.fault_fired()
        return self.fault.poison_loss(loss, iteration, self.rank)

    def reset_peaks(self, iteration: int) -> None:
        """At an iteration's first phase: fold the peaks since the last reset (model build, the gap
        between steps, CUDA-graph capture) into the high-water marks, then reset the allocator's peak
        statistics, so the peak read at the iteration's end is that iteration's own. Host-side counters,
        no device sync; nothing on CPU or before CUDA has started."""
        self.peaks_reset_for = iteration
        if self.device != "cuda":
            return
        import torch

        if not torch.cuda.is_initialized():
            return
        self.high_water.fold(
            int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
        )
        torch.cuda.reset_peak_memory_stats()

    def memory_peaks(self) -> MemoryReading:
        """The run's allocator high-water marks, the device memory in use (total - free: every process
        on this GPU) and this iteration's own allocator peaks."""
        if self.device != "cuda":
            return None, None, None, None, None
        import torch

        free, total = torch.cuda.mem_get_info()
        allocated, reserved = (
            int(torch.cuda.max_memory_allocated()),
            int(torch.cuda.max_memory_reserved()),
        )
        high_allocated, high_reserved = self.high_water.fold(allocated, reserved)
        return high_allocated, high_reserved, int(total - free), allocated, reserved

    def read_allocated(self, point: str) -> None:
        """``torch.cuda.memory_allocated()`` now, for ``point`` "after_step" or "after_zero_grad" (nothing
        on CPU): what is still allocated between iterations, i.e. carried into the next one. Host-side
        counter, no device sync."""
        if self.device != "cuda":
            return
        import torch

        self.allocated[point] = int(torch.cuda.memory_allocated())

    def iteration_end(
        self,
        iteration: int,
        *,
        loss: float | None,
        step_time_ms: float | None,
        skipped: bool = False,
        peaks: MemoryReading | None = None,
    ) -> None:
        """``peaks`` when read earlier (right after the optimizer step); else read now."""
        allocated, reserved, device_used, iteration_allocated, iteration_reserved = (
            self.memory_peaks() if peaks is None else peaks
        )
        carried = {f"allocated_{point}_bytes": value for point, value in self.allocated.items()}
        self.allocated = {}
        self.events.emit(
            "iteration",
            iteration=iteration,
            loss=loss,
            step_time_ms=step_time_ms,
            skipped=skipped,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            device_used_bytes=device_used,
            iteration_allocated_bytes=iteration_allocated,
            iteration_reserved_bytes=iteration_reserved,
            **carried,
            nan=loss is not None and not math.isfinite(loss),
        )

    def flops(self, iteration: int, flops: float) -> None:
        """The model FLOPs of one iteration (the world's); the record divides them by the step time."""
        self.events.emit("flops", iteration=iteration, flops=flops)

    def failed(self, exc: BaseException) -> None:
        """The error line, once per exception (the unwind hook and the worker may both report it)."""
        if exc is self._reported:
            return
        self._reported = exc
        self.events.emit(
            "error",
            iteration=getattr(exc, "iteration", self.iteration),
            phase=getattr(exc, "phase", self.phase_name),
            type=type(exc).__name__,
            message=str(exc)[:2000],
            local_loss_finite=getattr(exc, "local_finite", None),
        )
        if (
            not self.device_named
        ):  # failed before the back end named the GPU: the record still needs it
            with contextlib.suppress(Exception):
                self.device_ready()

    @contextlib.contextmanager
    def reporting_unwind(
        self,
        functions: list[Callable[..., Any]],
        before_report: Callable[[BaseException], None] | None = None,
    ) -> Iterator[None]:
        """Write the error line as soon as an exception leaves one of ``functions``, i.e. before whatever
        clean-up their caller runs. Python's ``sys.monitoring`` PY_UNWIND event (a global event: it
        costs one call per Python frame an exception unwinds, nothing on the normal path); only the
        given functions' frames report. ``before_report`` may refine the phase first."""
        monitoring = sys.monitoring
        tool = next((i for i in range(6) if monitoring.get_tool(i) is None), None)
        if (
            tool is None
        ):  # every tool slot is taken (a debugger, a profiler): the worker reports at the end
            yield
            return
        codes = {inspect.unwrap(function).__code__ for function in functions}

        def unwound(code: Any, offset: int, exc: BaseException) -> None:
            if code in codes and exc is not self._reported:
                if before_report is not None:
                    before_report(exc)
                self.failed(exc)

        monitoring.use_tool_id(tool, "recompute-harness")
        try:
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, unwound)
            monitoring.set_events(tool, monitoring.events.PY_UNWIND)
            yield
        finally:
            monitoring.set_events(tool, monitoring.events.NO_EVENTS)
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, None)
            monitoring.free_tool_id(tool)

    def finished(self) -> None:
        self.events.emit("done")
        self.events.close()
