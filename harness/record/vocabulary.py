"""The record's closed value sets, each declared once as an ``Enum``; the schema's checks, the golden
format, the analysis and ``docs/run-record.md`` (tested against them) all take their values from here.

Members are ``StrEnum``: a member equals its JSON string, so records stay plain JSON. The ``*_VALUES``
tuples are the plain strings, for membership checks and messages.
"""

from __future__ import annotations

from enum import StrEnum


class RecordKind(StrEnum):
    RUN = "run"  # measured by the runner
    CPU_PROBE = "cpu-probe"  # one probe row on CPU
    REFERENCE = "reference"  # a row transcribed from a published study


class RunStatus(StrEnum):
    COMPLETED = "completed"
    OOM = "oom"
    HANG = "hang"
    NAN = "nan"
    CRASH = "crash"
    ADVANCED_BUT_FAILED = "advanced-but-failed"
    INTERRUPTED = "interrupted"


class StepPhase(StrEnum):
    """In the order a training step reaches them: the order ranks how far a failed run got.
    ``cuda-graph-capture``: Bridge captures TE CUDA graphs between two steps (after
    ``cuda_graph_warmup_steps``), reported as the start of the step that first replays them."""

    MODEL_BUILD = "model-build"
    CUDA_GRAPH_CAPTURE = "cuda-graph-capture"
    FORWARD = "forward"
    BACKWARD = "backward"
    GRAD_SYNC = "grad-sync"
    OPTIMIZER_INIT = "optimizer-init"
    OPTIMIZER_STEP = "optimizer-step"


class PeakScope(StrEnum):
    """Whose peak a number is: the hottest rank (what runs report), rank 0, the hottest of the
    data-parallel rank-0 ranks (Bridge's memory report prints on data-parallel rank 0), or, for a
    headline only, not reported."""

    ALL_RANKS = "all-ranks"
    RANK0 = "rank0"
    DP_RANK0 = "dp-rank0"
    UNREPORTED = "unreported"


KIND_VALUES: tuple[str, ...] = tuple(kind.value for kind in RecordKind)
STATUS_VALUES: tuple[str, ...] = tuple(status.value for status in RunStatus)
PHASE_VALUES: tuple[str, ...] = tuple(phase.value for phase in StepPhase)
PEAK_SCOPE_VALUES: tuple[str, ...] = tuple(scope.value for scope in PeakScope)
# The scopes a peak can be taken over (goldens, effects): every headline scope but "unreported".
MEASURED_PEAK_SCOPES: tuple[str, ...] = tuple(
    scope.value for scope in PeakScope if scope is not PeakScope.UNREPORTED
)
# Kinds whose metrics are a run's (not a probe's).
RUN_KIND_VALUES: tuple[str, ...] = (RecordKind.RUN.value, RecordKind.REFERENCE.value)
