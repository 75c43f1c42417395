"""Probe style models: measure every planned row against the ``[]`` control and classify it.

Rows run in this process on one gloo group (imports and the group are paid once); only rows that
may hang run isolated (harness.probe.workers.isolate), started before and collected after the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness.config.fields import RecomputeFields
from harness.cpu.adapter import init_cpu_parallel_state, transformer_engine_available
from harness.cpu.deferred_compile import forget_compilations
from harness.errors import EXIT_FAILED, UsageError
from harness.models import StyleModel, build_model, style_model
from harness.probe.measurement.carried import frozen_across_rows
from harness.probe.measurement.measure import Measurement, measure
from harness.probe.measurement.status import (
    CONTROL_STATUS,
    EFFECTIVE,
    ERROR,
    INACTIVE,
    REJECTED,
    REQUIRES_TE,
    Equivalence,
    MeasuredRow,
    compare_numerics,
    exception_line,
    failure_status,
    requires_te_reason,
    sum_order_reason,
    te_only_labels_missing,
)
from harness.probe.plan import CONTROL, PRECISIONS, ProbeRow, plan_rows
from harness.probe.workers.isolate import DEFAULT_HANG_TIMEOUT_S, IsolatedProbe
from harness.processes import exit_if_stopped

DEFAULT_ROW_TIMEOUT_S = 120.0  # an in-process row takes well under a second
# The deadlock row is about MCore's CheckpointFunction, not a model's shape, and each isolated child
# pays a fresh torch + MCore import: it runs on the dense model only.
HANG_PROBE_MODELS = ("dense-tiny",)
DTYPES = dict(zip(PRECISIONS, (torch.float32, torch.bfloat16), strict=True))


@dataclass(frozen=True)
class ProbeValues:
    """What a measured probe row always has, as non-optional values."""

    retained_bytes: int
    backward_flops: int
    replay_bytes: int
    replay_ops: int
    equivalence: Equivalence  # fp32, dropout off
    dropout_equivalence: Equivalence


@dataclass(kw_only=True)
class ProbeRowResult(MeasuredRow):
    """A probe row: the shared verdict, plus what only the CPU probe measures."""

    fields: RecomputeFields
    add_bias_linear: bool
    backward_flops: int | None = None
    replay_bytes: int | None = None
    replay_ops: int | None = None
    equivalence: Equivalence | None = None  # fp32, dropout off
    dropout_equivalence: Equivalence | None = None  # dropout on: equal only if the RNG replays
    attribution: dict[str, int] = field(default_factory=dict)
    carried_bytes: int | None = (
        None  # what a second step leaves alive after backward (harness.probe.measurement.carried)
    )
    carried_attribution: dict[str, int] = field(default_factory=dict)
    carried_holders: list[dict[str, Any]] = field(
        default_factory=list
    )  # CarriedTensor fields, per storage
    # StepPeaks.as_dict(): per phase the breakdown at its peak and ``step_bytes``; per module the
    # activation + temporary bytes at its own forward / backward peak (harness.probe.measurement.peaks)
    step_peaks: dict[str, Any] = field(default_factory=dict)
    # On a pipeline stage under 1F1B: the most autograd-saved bytes alive at once across the
    # micro-batches in flight (harness.probe.layouts.pipeline); None on the single-stage probe
    inflight_bytes: int | None = None

    def values(self) -> ProbeValues:
        """The counts and verdicts every measured row has (ValueError for a row that was not)."""
        values = (
            self.retained_bytes,
            self.backward_flops,
            self.replay_bytes,
            self.replay_ops,
            self.equivalence,
            self.dropout_equivalence,
        )
        if any(value is None for value in values):
            raise ValueError(f"{self.label}: not measured ({self.status})")
        return ProbeValues(*values)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fields"] = self.fields.as_dict()
        # `probe --json`'s key order since before the shared type: label, fields, add_bias_linear first.
        return {key: data[key] for key in ("label", "fields", "add_bias_linear")} | data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeRowResult:
        data = dict(data)
        data["fields"] = RecomputeFields.from_dict(data["fields"])
        for holder in data.get("carried_holders", []):
            holder["shape"] = tuple(holder["shape"])  # JSON brought it back as a list
        for key in ("equivalence", "dropout_equivalence"):
            if data[key] is not None:
                data[key] = Equivalence(**data[key])
        return cls(**data)


@dataclass
class ModelProbe:
    model: str
    description: str
    seq_length: int
    micro_batch_size: int
    rows: list[ProbeRowResult]
    attention_backend: str = "unfused"  # harness.cpu.attention.ATTENTION_BACKENDS
    precision: str = "fp32"  # harness.probe.plan.PRECISIONS
    # Pipeline-parallel size and this probe's stage (harness.probe.layouts.pipeline); 1 and 0: the whole model
    pipeline_parallel: int = 1
    stage: int = 0
    # Tensor-parallel size, sequence parallel on when above 1 (harness.probe.layouts.tensor_parallel)
    tensor_parallel: int = 1

    @property
    def control(self) -> ProbeRowResult:
        return next(row for row in self.rows if row.fields == CONTROL and not row.add_bias_linear)

    @property
    def pass_name(self) -> str:
        """The model, with the back end and precision when they are not the default pass's: one model
        is probed in several passes, and a message about one row must say which."""
        qualifiers = [
            value
            for value, default in ((self.attention_backend, "unfused"), (self.precision, "fp32"))
            if value != default
        ]
        if self.pipeline_parallel > 1:
            qualifiers.append(f"PP {self.pipeline_parallel} stage {self.stage}")
        if self.tensor_parallel > 1:
            qualifiers.append(f"TP {self.tensor_parallel} + SP")
        return f"{self.model} ({', '.join(qualifiers)})" if qualifiers else self.model

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelProbe:
        """A probe from ``probe --json``'s form (``harness.probe.present.table.probe_json``, as a pipeline
        rank or a pass worker writes it): keys it derives, such as the unmeasured rows, are not
        fields and are dropped."""
        names = {item.name for item in dataclasses.fields(cls)} - {"rows"}
        return cls(
            **{key: value for key, value in data.items() if key in names},
            rows=[ProbeRowResult.from_dict(row) for row in data["rows"]],
        )


@dataclass
class Baseline:
    """The ``[]`` control of one model: its weights (shared by every row), and the first step's loss,
    gradients and counts (dropout off) and loss and gradients (dropout on) every row is compared with."""

    state: dict[str, Any]
    fp32: Measurement
    dropout: Measurement


def _build(
    model: str, fields: RecomputeFields, *, dropout: bool, add_bias_linear: bool, **sizes: Any
):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_model(
            model, fields, dropout=dropout, add_bias_linear=add_bias_linear, **sizes
        )
    if "dtype" in sizes:
        # Training in bf16 wraps the model in Megatron's Float16Module, which casts every parameter;
        # MCore's torch norms are built in fp32 whatever params_dtype says.
        built.module.to(sizes["dtype"])
    return built


def baseline(
    model: str, *, add_bias_linear: bool = False, seed: int = 1234, **sizes: Any
) -> Baseline:
    control = _build(model, CONTROL, dropout=False, add_bias_linear=add_bias_linear, **sizes)
    state = (
        control.module.state_dict()
    )  # never trained: forward + backward leave the weights as built
    # What every row is compared with: its first step, instrumented as a row's is (on the head an
    # uninstrumented step differed in 12 values of dense-tiny: with no dispatch mode active, Megatron
    # Core's torch.compile'd helpers run compiled). Carried bytes and step peaks are the [] row's.
    fp32 = measure(control, seed=seed, later_steps=False)
    with_dropout = _build(model, CONTROL, dropout=True, add_bias_linear=add_bias_linear, **sizes)
    with_dropout.module.load_state_dict(state)
    return Baseline(state, fp32, measure(with_dropout, seed=seed, instrument=False))


def _failed_row(row: ProbeRow, exc: BaseException) -> ProbeRowResult:
    status, reason = failure_status(exc)
    return ProbeRowResult(
        row.label, status, reason, fields=row.fields, add_bias_linear=row.add_bias_linear
    )


def measure_row(
    model: str, row: ProbeRow, base: Baseline, *, seed: int = 1234, **sizes: Any
) -> ProbeRowResult:
    """Build ``row`` with the control's weights, measure it, classify it."""
    from harness.config.validate import MCORE_REJECTIONS, ConfigRejected, refused_at_run_time

    # What an accepted configuration does on this revision is the row's result, an exception too.
    try:
        built = _build(
            model, row.fields, dropout=False, add_bias_linear=row.add_bias_linear, **sizes
        )
    except MCORE_REJECTIONS as exc:
        rejected = ConfigRejected.from_exception(exc)
        message = (
            rejected.message.strip().splitlines()[0]
            if rejected.message.strip()
            else rejected.mcore_exception
        )
        return ProbeRowResult(
            row.label,
            REJECTED,
            message,
            rejected.rule,
            fields=row.fields,
            add_bias_linear=row.add_bias_linear,
        )
    except Exception as exc:  # noqa: BLE001
        return _failed_row(row, exc)
    built.module.load_state_dict(base.state)
    try:
        result = measure(built, seed=seed)
    except Exception as exc:  # noqa: BLE001
        if not refused_at_run_time(exc):
            return _failed_row(row, exc)
        rejected = ConfigRejected.from_exception(exc)
        return ProbeRowResult(
            row.label,
            REJECTED,
            f"accepted by the validator, refused at the first forward: {exception_line(exc)}",
            rejected.rule,
            fields=row.fields,
            add_bias_linear=row.add_bias_linear,
        )
    if result.carried is None or result.peaks is None:
        raise RuntimeError("an instrumented measurement has carried bytes and step peaks")
    with_dropout = _build(
        model, row.fields, dropout=True, add_bias_linear=row.add_bias_linear, **sizes
    )
    with_dropout.module.load_state_dict(base.state)
    dropout = measure(with_dropout, seed=seed, instrument=False)

    equivalence = compare_numerics(result.loss, result.grads, base.fp32.loss, base.fp32.grads)
    counts = (result.retained_bytes, result.backward_flops, result.replay_bytes)
    control_counts = (base.fp32.retained_bytes, base.fp32.backward_flops, base.fp32.replay_bytes)
    labels = row.fields.modules or ()
    missing_te = te_only_labels_missing(labels, built.module, transformer_engine_available())
    if row.fields == CONTROL:
        status, reason = CONTROL_STATUS, ""
    elif missing_te:
        status, reason = REQUIRES_TE, requires_te_reason(missing_te, built.module)
    elif counts == control_counts:
        status, reason = (
            INACTIVE,
            "accepted, but retained bytes, backward FLOPs and replayed bytes equal []",
        )
    else:
        status, reason = EFFECTIVE, sum_order_reason(labels, equivalence)
    return ProbeRowResult(
        row.label,
        status,
        reason,
        None,
        result.retained_bytes,
        fields=row.fields,
        add_bias_linear=row.add_bias_linear,
        backward_flops=result.backward_flops,
        replay_bytes=result.replay_bytes,
        replay_ops=result.replay_ops,
        equivalence=equivalence,
        dropout_equivalence=compare_numerics(
            dropout.loss, dropout.grads, base.dropout.loss, base.dropout.grads
        ),
        attribution=result.attribution,
        carried_bytes=result.carried.bytes,
        carried_attribution=result.carried.attribution(),
        carried_holders=[asdict(tensor) for tensor in result.carried.tensors],
        step_peaks=result.peaks.as_dict(),
    )


@contextlib.contextmanager
def watchdog(timeout_s: float, what: str, cleanup: Callable[[], None]) -> Iterator[None]:
    """In-process rows are not expected to hang; if one does (after an MCore bump), say which, dump
    every thread's stack, run ``cleanup`` (kill isolated children) and end the process rather than
    hang the suite. A deadlocked autograd engine releases the GIL, so the timer thread runs."""

    def fire() -> None:
        sys.stderr.write(
            f"recompute-harness: error: hang: {what} ran past {timeout_s:.0f} s; "
            "stacks follow, exiting\n"
        )
        faulthandler.dump_traceback(all_threads=True)
        cleanup()
        os._exit(EXIT_FAILED)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Tiny matmuls run ~5x faster on one intra-op thread here: OpenMP workers spin against the
    isolated child and other jobs on a 2-core box. Counts and bitwise verdicts do not depend on it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def measure_row_pair(
    model: str, row: ProbeRow, *, seed: int = 1234, **sizes: Any
) -> dict[str, Any]:
    """Control + row in one go (the isolated child's job), as JSON-ready data."""
    with single_thread():
        base = baseline(model, add_bias_linear=row.add_bias_linear, seed=seed, **sizes)
        return measure_row(model, row, base, seed=seed, **sizes).as_dict()


def probe_models(
    models: list[str],
    label_sets: list[tuple[str, ...]] | None = None,
    *,
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S,
    hang_probe: bool = True,
    row_timeout_s: float = DEFAULT_ROW_TIMEOUT_S,
    seed: int = 1234,
    seq_length: int | None = None,
    micro_batch_size: int | None = None,
    attention_backend: str = "unfused",
    precision: str = "fp32",
    sequence_parallel: bool = False,
) -> list[ModelProbe]:
    """Probe each model; rows that may hang run in parallel child processes under a timeout
    (``hang_probe=False`` leaves them out), every other row in this process under a watchdog.
    ``sequence_parallel``: the models are built with it (on a rank of a TP group,
    harness.probe.layouts.tensor_parallel).

    ``precision`` (harness.probe.plan.PRECISIONS) is the parameters' and activations' dtype. The
    deadlock row is probed in fp32 only: it is about ``CheckpointFunction``, not the dtype."""
    styles = [style_model(name) for name in models]
    sizes: dict[str, Any] = {
        key: value
        for key, value in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size))
        if value is not None
    }
    sizes["attention_backend"] = attention_backend
    if sequence_parallel:
        sizes["sequence_parallel"] = True
    if precision not in DTYPES:
        raise UsageError(f"unknown precision {precision!r}; known: {', '.join(DTYPES)}")
    if precision != "fp32":
        sizes["dtype"] = DTYPES[precision]
        hang_probe = False
    rows = {
        style.name: plan_rows(label_sets, layers=style.layers, hang_probe=hang_probe)
        for style in styles
    }
    children = [
        IsolatedProbe(style.name, row, timeout_s=hang_timeout_s, seed=seed, **sizes)
        for style in styles
        if style.name in HANG_PROBE_MODELS
        for row in rows[style.name]
        if row.may_hang
    ]

    def kill_children() -> None:
        for child in children:
            child.kill()

    try:
        init_cpu_parallel_state(seed=seed)
        with single_thread(), frozen_across_rows():
            probes = {
                style.name: _probe_in_process(
                    style,
                    [row for row in rows[style.name] if not row.may_hang],
                    seed=seed,
                    sizes=sizes,
                    row_timeout_s=row_timeout_s,
                    cleanup=kill_children,
                )
                for style in styles
            }
        for child in children:
            probes[child.model].rows.append(_isolated_row(child))
    finally:
        kill_children()
    return list(probes.values())


def _probe_in_process(
    style: StyleModel,
    rows: list[ProbeRow],
    *,
    seed: int,
    sizes: dict[str, Any],
    row_timeout_s: float,
    cleanup: Callable[[], None],
) -> ModelProbe:
    forget_compilations()  # a pass measures what a fresh process would, whatever ran before it
    try:
        with watchdog(row_timeout_s, f"the [] control of {style.name}", cleanup):
            base = baseline(style.name, seed=seed, **sizes)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model this tree cannot build is recorded, not fatal
        why = f"the [] control raised {exception_line(exc)}"
        results = [
            ProbeRowResult(
                row.label, ERROR, why, fields=row.fields, add_bias_linear=row.add_bias_linear
            )
            for row in rows
        ]
    else:
        results = [
            _measure_or_error(style, row, base, seed, sizes, row_timeout_s, cleanup) for row in rows
        ]
    return ModelProbe(
        style.name,
        style.description,
        sizes.get("seq_length", style.seq_length),
        sizes.get("micro_batch_size", style.micro_batch_size),
        results,
        sizes.get("attention_backend", "unfused"),
        next(name for name, dtype in DTYPES.items() if dtype == sizes.get("dtype", torch.float32)),
    )


def _measure_or_error(
    style: StyleModel,
    row: ProbeRow,
    base: Baseline,
    seed: int,
    sizes: dict[str, Any],
    row_timeout_s: float,
    cleanup: Callable[[], None],
) -> ProbeRowResult:
    """One row, or (when building or measuring it raises) an ``error`` (or ``requires-CUDA``) row
    naming the exception."""
    exit_if_stopped()
    try:
        with watchdog(row_timeout_s, f"row {row.label} of {style.name}", cleanup):
            return measure_row(style.name, row, base, seed=seed, **sizes)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - one row that raises must not lose the others
        return _failed_row(row, exc)


def probe_errors(probes: list[ModelProbe]) -> list[str]:
    """``model / label: reason`` for every row recorded as ``error``."""
    return [
        f"{probe.pass_name} / {row.label}: {row.reason}"
        for probe in probes
        for row in probe.rows
        if row.status == ERROR
    ]


def _isolated_row(child: IsolatedProbe) -> ProbeRowResult:
    outcome = child.outcome()
    if outcome.payload is not None:
        return ProbeRowResult.from_dict(outcome.payload)
    # "hang", or "crash" when the child died
    return ProbeRowResult(
        child.row.label,
        outcome.status,
        outcome.message,
        fields=child.row.fields,
        add_bias_linear=child.row.add_bias_linear,
    )
