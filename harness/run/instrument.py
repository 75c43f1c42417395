"""Worker-side instrumentation shared by both back ends: phases, per-iteration peaks, errors, faults.

Per iteration it costs one flushed JSON line per phase plus one for the iteration, and two reads of
the CUDA caching allocator's counters (``max_memory_allocated``/``max_memory_reserved``, host-side, no
device sync), plus ``memory_allocated()`` after the optimizer step and after zero_grad (memory carried
into the next iteration). Phases are marked on the host; an OOM is raised on the host by the allocating call,
so the phase it is reported in is the one that allocated. On CPU there is no caching allocator and
so no allocator peak: peaks are reported as ``None`` and the record says so.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.run.events import EventWriter
from harness.run.faults import fault_from_env


class NonFiniteLoss(FloatingPointError):
    """The world-reduced loss is NaN/inf; ``local_finite`` says whether this rank's own loss was."""

    def __init__(self, iteration: int, reduced: float, local: float) -> None:
        super().__init__(f"non-finite loss at iteration {iteration}: reduced {reduced}, this rank {local}")
        self.local_finite = math.isfinite(local)


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
        self.allocated: dict[str, int] = {}  # memory_allocated() read this iteration, emitted at its end

    def started(self, world_size: int) -> None:
        """Announce this rank. No CUDA call here: CUDA reads some settings once, when it initialises
        (the allocator's ``PYTORCH_CUDA_ALLOC_CONF``), and a back end may still have to set them."""
        self.events.emit("start", rank=self.rank, world_size=world_size, pid=os.getpid(), device=self.device)

    def device_ready(self) -> None:
        """Name this rank's GPU; back ends call it once they have set CUDA up (nothing on CPU)."""
        if self.device != "cuda":
            return
        import torch

        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.events.emit("device", name=properties.name, sm=f"{properties.major}.{properties.minor}")
        self.device_named = True

    def enter(self, iteration: int, name: str) -> None:
        """Mark the start of a phase (and give the fault hook its chance to fire there)."""
        self.iteration, self.phase_name = iteration, name
        self.events.emit("phase", iteration=iteration, phase=name)
        if self.fault is not None:
            self.fault.at_phase_start(iteration, name, self.rank)

    @contextlib.contextmanager
    def phase(self, iteration: int, name: str) -> Iterator[None]:
        self.enter(iteration, name)
        yield

    def note(self, key: str, value: str) -> None:
        """A fact about how the workload actually ran (e.g. a dispatcher fallback), kept in the record."""
        self.events.emit("note", key=key, value=value)

    def loss(self, loss: Any, iteration: int) -> Any:
        """The fault hook's chance to poison this rank's loss (identity unless a nan fault is set)."""
        return loss if self.fault is None else self.fault.poison_loss(loss, iteration, self.rank)

    def memory_peaks(self) -> tuple[int | None, int | None]:
        if self.device != "cuda":
            return None, None
        import torch

        return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())

    def read_allocated(self, point: str) -> None:
        """``torch.cuda.memory_allocated()`` now, for ``point`` "after_step" or "after_zero_grad" (nothing
        on CPU): what is still allocated between iterations, i.e. carried into the next one. Host-side
        counter, no device sync."""
        if self.device != "cuda":
            return
        import torch

        self.allocated[point] = int(torch.cuda.memory_allocated())

    def iteration_end(self, iteration: int, *, loss: float | None, step_time_ms: float | None,
                      skipped: bool = False, tflops_per_gpu: float | None = None,
                      peaks: tuple[int | None, int | None] | None = None) -> None:
        """``peaks`` when read earlier (right after the optimizer step); else read now."""
        allocated, reserved = self.memory_peaks() if peaks is None else peaks
        carried = {f"allocated_{point}_bytes": value for point, value in self.allocated.items()}
        self.allocated = {}
        self.events.emit(
            "iteration", iteration=iteration, loss=loss, step_time_ms=step_time_ms, skipped=skipped,
            allocated_bytes=allocated, reserved_bytes=reserved, tflops_per_gpu=tflops_per_gpu,
            nan=loss is not None and not math.isfinite(loss), **carried,
        )

    def failed(self, exc: BaseException) -> None:
        self.events.emit(
            "error", iteration=self.iteration, phase=self.phase_name, type=type(exc).__name__,
            message=str(exc)[:2000], local_loss_finite=getattr(exc, "local_finite", None),
        )
        if not self.device_named:  # failed before the back end named the GPU: the record still needs it
            with contextlib.suppress(Exception):
                self.device_ready()

    def finished(self) -> None:
        self.events.emit("done")
        self.events.close()
