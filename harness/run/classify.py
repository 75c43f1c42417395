"""How a row ended, decided from per-rank evidence only.

Order of evidence: a rank's own error line (written by the worker with the phase it was in,
before upstream clean-up runs: Bridge's ``_pretrain`` aborts its process groups before re-raising,
and that abort can hang) decides, even when the runner then had to stop the row. Otherwise a row
the runner had to stop (timeout, or no rank reporting for the stall timeout) before every rank
finished is a ``hang`` at the furthest-behind rank's iteration and phase. Otherwise a rank whose
stderr holds the NCCL watchdog's timeout report (below) makes the row a ``hang`` at the furthest-behind
rank, even though that aborted rank is the first to die unreported. Otherwise torchrun's
per-rank ``error.json`` files, then the ranks' stderr: torch's NCCL watchdog kills a process whose
collective timed out (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``, torch's default) with SIGABRT, leaving
no Python error and no error file, only its "Watchdog caught collective operation timeout" line. A
peer's loss ("connection closed", "communicator aborted") is a consequence, never the root, when
another rank reports its own error. The root error's kind: an out-of-memory message -> ``oom``; a
collective timeout -> ``hang``; a non-finite (NaN or Inf) loss -> ``nan``, the numerical-failure
status; anything else -> ``crash``. A run that exits cleanly with every iteration reported on every
rank is ``completed``.

Against the matched control: a failed row that got further than a failed ``[]`` control is
``advanced-but-failed`` — the skill's "later failure is misclassified as success" guard.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.record.model import Outcome
from harness.record.schema import PHASES
from harness.run.events import RankEvidence
from harness.run.torchrun import TORCHRUN_DIR, LaunchResult

OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "cublas_status_alloc_failed",
    "cudaerrormemoryallocation",
)
# Ours (the mcore loop's NonFiniteLoss) and Megatron's NaN / Inf checks on the loss (Bridge's
# masked_next_token_loss through the rerun state machine: "found NaN in local forward loss
# calculation", "found Inf in local forward loss calculation"; MCore's grad-norm checks).
NAN_MARKERS = (
    "non-finite loss",
    "nan in local forward loss",
    "inf in local forward loss",
    "found nan",
    "found inf",
    "loss is nan",
    "loss is inf",
)
PEER_LOSS_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "communicator was aborted",
    "terminated with signal",
)
# A collective that timed out waited for a rank that never came: a hang, seen from the waiting side.
HANG_MARKERS = ("timed out", "collective operation timeout")
# What torch's NCCL watchdog writes to the rank's stderr before it aborts the process (ProcessGroupNCCL).
WATCHDOG_MARKER = "watchdog caught collective operation timeout"
STDERR_TAIL_BYTES = 256 * 1024  # the watchdog's line is among the last a killed rank writes


@dataclass(frozen=True)
class Classification:
    status: str
    iteration: int | None
    phase: str | None
    ranks: tuple[int, ...]
    message: str

    @property
    def position(self) -> tuple[int, int] | None:
        if self.iteration is None:
            return None
        return self.iteration, -1 if self.phase is None else PHASES.index(self.phase)

    def as_record(self) -> Outcome:
        return Outcome(self.status, self.iteration, self.phase, list(self.ranks), self.message)


def error_kind(type_name: str | None, message: str) -> str:
    text = f"{type_name or ''}: {message}".lower()
    if any(marker in text for marker in OOM_MARKERS):
        return "oom"
    if any(marker in text for marker in HANG_MARKERS):
        return "hang"
    if type_name in ("NonFiniteLoss", "FloatingPointError") or any(
        marker in text for marker in NAN_MARKERS
    ):
        return "nan"
    return "crash"


def _is_peer_loss(message: str) -> bool:
    text = message.lower()
    return any(marker in text for marker in PEER_LOSS_MARKERS)


def torchrun_errors(row_dir: Path) -> list[dict[str, Any]]:
    """torchrun's per-rank reply files (written by ``@record``): type, message, timestamp."""
    found = []
    for path in sorted(Path(row_dir, TORCHRUN_DIR).rglob("error.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        message = data.get("message", {})
        if isinstance(message, dict):
            text = str(message.get("message", ""))
            timestamp = (message.get("extraInfo") or {}).get("timestamp")
        else:
            text, timestamp = str(message), None
        found.append({"path": str(path), "message": text, "t": float(timestamp or 0)})
    return found


_RAISED = re.compile(
    r"\s*(?:\[rank\d+\]:\s*)?[\w.]*(?:Error|Exception|Interrupt)\b"
)  # "ModuleNotFoundError: ..."


def _tail(path: Path) -> str:
    """The last ``STDERR_TAIL_BYTES`` of a log ("" when unreadable)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - STDERR_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_words(row_dir: Path) -> str | None:
    """For ranks that died without an error line or file: the last line a rank wrote to stderr (an
    import error's traceback ends there), else the last line of torchrun's own log (its agent failing
    before any worker started); "<file>: <line>", or None when every log is empty."""
    for path in sorted(
        Path(row_dir, TORCHRUN_DIR).rglob("stderr.log")
    ):  # warnings are not the cause
        line = next(
            (line.strip() for line in reversed(_tail(path).splitlines()) if _RAISED.match(line)),
            None,
        )
        if line is not None:
            return f"{path.relative_to(row_dir)}: {line[:400]}"
    for path in sorted(Path(row_dir).glob("launcher*.log")):
        line = next(
            (line.strip() for line in reversed(_tail(path).splitlines()) if line.strip()), None
        )
        if line is not None:
            return f"{path.relative_to(row_dir)}: {line[:400]}"
    return None


def watchdog_timeouts(row_dir: Path) -> list[tuple[Path, str]]:
    """(stderr.log, line) for each rank whose stderr ends with torch's NCCL watchdog timeout report."""
    found = []
    for path in sorted(Path(row_dir, TORCHRUN_DIR).rglob("stderr.log")):
        line = next(
            (line for line in _tail(path).splitlines() if WATCHDOG_MARKER in line.lower()), None
        )
        if line is not None:
            found.append((path, line.strip()))
    return found


# torchrun's failure summary: "Root Cause (first observed failure):" then, per failed rank,
# "rank : 1 (local_rank: 1)" and "exitcode : -9 (pid: 123)".
_TORCHRUN_FAILURE = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.DOTALL
)


def torchrun_exit_codes(row_dir: Path) -> dict[int, int]:
    """Global rank -> exit code of each rank torchrun's agents name as the root cause (first observed
    failure) in their launcher logs; the ranks an agent stopped afterwards are not listed there."""
    codes: dict[int, int] = {}
    for log in sorted(Path(row_dir).glob("launcher*.log")):
        try:
            text = log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for section in text.split("Root Cause")[1:]:
            section = section.split("=" * 20)[0]  # up to the end of the summary box
            for rank, code in _TORCHRUN_FAILURE.findall(section):
                codes.setdefault(int(rank), int(code))
    return codes


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "process ended without reporting"
    if code < 0:
        try:
            return f"exitcode {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"exitcode {code}"
    return f"exitcode {code}"


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0][:400] if message.strip() else ""


def classify(
    ranks: list[RankEvidence],
    launch: LaunchResult,
    *,
    train_iters: int,
    row_dir: Path,
    stall_timeout_s: float,
    timeout_s: float,
) -> Classification:
    outcome = _classify(ranks, launch, train_iters, row_dir, stall_timeout_s, timeout_s)
    if launch.killed_leftovers:
        outcome = replace(
            outcome,
            message=f"{outcome.message}; killed {len(launch.killed_leftovers)} process(es) "
            "that outlived torchrun",
        )
    return outcome


def _classify(
    ranks: list[RankEvidence],
    launch: LaunchResult,
    train_iters: int,
    row_dir: Path,
    stall_timeout_s: float,
    timeout_s: float,
) -> Classification:
    unfinished = [rank for rank in ranks if not rank.done]
    errors = [(rank.rank, error) for rank in ranks for error in rank.errors]
    own = [(rank, error) for rank, error in errors if not _is_peer_loss(error.get("message", ""))]
    if launch.stopped not in (None, "died") and unfinished:
        if own:
            # A rank reported its own failure and then never exited (a clean-up that hung): the
            # failure is the root, the stop its consequence.
            found = _from_error_events(errors)
            return replace(
                found,
                message=f"{found.message}; then the runner stopped the row ({launch.stopped})",
            )
        # Stopped while some rank was still silent: a hang. One whose every unfinished rank had already
        # reported (a lost peer) only ended slowly; who died first decides below.
        if any(not rank.errors for rank in unfinished):
            return _hang(ranks, launch, stall_timeout_s, timeout_s)
    # A rank torch's NCCL watchdog aborted (SIGABRT) dies unreported and first, so it would look like the
    # root cause below; it only waited for a peer: the row hung where the furthest-behind rank stopped.
    if not own and (watchdog := watchdog_timeouts(row_dir)):
        return _watchdog_hang(unfinished or ranks, launch, watchdog)
    dead = _died_silently(ranks, errors, launch, row_dir)
    if dead is not None:
        return dead
    if errors:
        return _from_error_events(errors)
    if unfinished:
        return _from_torchrun(unfinished, launch, row_dir)
    short = [rank.rank for rank in ranks if len(rank.iterations) < train_iters]
    if short:
        return Classification(
            "crash",
            None,
            None,
            tuple(short),
            f"rank(s) {short} finished without reporting all {train_iters} iterations",
        )
    nan = [rank.rank for rank in ranks if any(it.get("nan") for it in rank.iterations)]
    if nan:
        return Classification("nan", None, None, tuple(nan), "non-finite loss reported")
    lost = [node for node, code in enumerate(launch.returncodes) if code is not None and code < 0]
    if lost:  # every rank reported, but a node's agent was killed: the row cannot be trusted
        per_node = len(ranks) // max(len(launch.returncodes), 1)
        node_ranks = tuple(
            r for node in lost for r in range(node * per_node, (node + 1) * per_node)
        )
        return Classification(
            "crash",
            None,
            None,
            node_ranks,
            f"torchrun agent(s) of node(s) {lost} lost ({', '.join(_describe_exit(launch.returncodes[n]) for n in lost)})",
        )
    exit_note = (
        ""
        if launch.succeeded
        else f" (then the processes did not exit cleanly: {launch.stopped or launch.returncodes})"
    )
    return Classification(
        "completed",
        train_iters,
        None,
        (),
        f"completed {train_iters} iterations on {len(ranks)} ranks{exit_note}",
    )


def _died_silently(
    ranks: list[RankEvidence],
    errors: list[tuple[int, dict[str, Any]]],
    launch: LaunchResult,
    row_dir: Path,
) -> Classification | None:
    """The first rank to die without a word (SIGKILL, an early exit) is the root cause: every error the
    others wrote is then only a peer's loss (collateral). Evidence, strongest first: the runner saw the
    rank's process end unreported (of several seen in one poll, those torchrun names); torchrun names
    it the root cause (exit code or signal); it is the rank that stopped first while the others
    report only a lost peer."""
    if any(not _is_peer_loss(error.get("message", "")) for _, error in errors):
        return None  # a rank said what went wrong: that is the evidence (error events)
    silent = [rank for rank in ranks if not rank.done and not rank.errors]
    if not silent:
        return None
    codes = torchrun_exit_codes(row_dir)
    seen_dead = [rank for rank in silent if rank.rank in launch.died]
    named = [rank for rank in silent if codes.get(rank.rank, 0) != 0]
    # Ranks seen dead in one poll of the runner may include a peer torchrun's agent stopped after the
    # first failure it observed: the one it names died first.
    signalled = [rank for rank in seen_dead if rank in named] or seen_dead or named
    if not signalled and not errors:
        return None  # nobody died first that we can tell: torchrun's error files decide
    blamed = signalled or silent
    first = min(blamed, key=lambda rank: rank.last_time or 0.0)
    if not signalled:  # only the order of events: the rank(s) that stopped first
        blamed = [rank for rank in blamed if rank.position == first.position]
    collateral = sorted(
        {r for r, _ in errors} | {r.rank for r in ranks if not r.done and r not in blamed}
    )
    where = (
        f"iteration {first.iteration} {first.phase}" if first.phase else "before its first phase"
    )
    message = (
        f"rank(s) {[r.rank for r in blamed]} died at {where} "
        f"({'; '.join(f'rank {r.rank} {_describe_exit(codes.get(r.rank))}' for r in blamed)})"
    )
    if collateral:
        message += f"; collateral: rank(s) {collateral} (lost their peer)"
    return Classification(
        "crash",
        first.iteration if first.phase else None,
        first.phase,
        tuple(r.rank for r in blamed),
        message,
    )


def _behind(ranks: list[RankEvidence]) -> tuple[tuple[int, int], list[RankEvidence]]:
    lowest = min(rank.position for rank in ranks)
    return lowest, [rank for rank in ranks if rank.position == lowest]


def _hang(
    ranks: list[RankEvidence], launch: LaunchResult, stall_timeout_s: float, timeout_s: float
) -> Classification:
    unfinished = [rank for rank in ranks if not rank.done]
    # The ranks that stopped reporting: unfinished and silent (a rank whose collective timed out said so).
    waiting = [rank for rank in unfinished if not rank.errors] or unfinished or ranks
    _, stuck = _behind(waiting)
    first = stuck[0]
    limit = stall_timeout_s if launch.stall_limit_s is None else launch.stall_limit_s
    allowance = " (the first-iteration allowance)" if limit != stall_timeout_s else ""
    why = (
        f"no rank reported progress for {limit:g} s{allowance}"
        if launch.stopped == "stall"
        else f"still running after the {timeout_s:g} s timeout"
    )
    where = (
        f"iteration {first.iteration} {first.phase}" if first.phase else "before its first phase"
    )
    return Classification(
        "hang",
        first.iteration if first.phase else None,
        first.phase,
        tuple(rank.rank for rank in stuck),
        f"{why}; rank(s) {[rank.rank for rank in stuck]} stopped at {where}; process group killed",
    )


def _from_error_events(errors: list[tuple[int, dict[str, Any]]]) -> Classification:
    own = [(rank, error) for rank, error in errors if not _is_peer_loss(error.get("message", ""))]
    candidates = own or errors
    root_rank, root = min(candidates, key=lambda item: item[1].get("t", 0.0))
    kind = error_kind(root.get("type"), root.get("message", ""))
    same = sorted(
        {
            rank
            for rank, error in candidates
            if error_kind(error.get("type"), error.get("message", "")) == kind
        }
    )
    if kind == "nan":
        # Every rank stops on the reduced loss; the ranks whose own loss was non-finite are the origin.
        origin = [
            (rank, error) for rank, error in candidates if error.get("local_loss_finite") is False
        ]
        if origin:
            root_rank, root = min(origin, key=lambda item: item[1].get("t", 0.0))
            same = sorted({rank for rank, _ in origin})
    message = f"{root.get('type')}: {_first_line(root.get('message', ''))} (rank {root_rank})"
    return Classification(kind, root.get("iteration"), root.get("phase"), tuple(same), message)


def _from_torchrun(
    unfinished: list[RankEvidence], launch: LaunchResult, row_dir: Path
) -> Classification:
    """No rank wrote an error line (killed by a signal, died in an import): use torchrun's files."""
    files = torchrun_errors(row_dir)
    own = [item for item in files if not _is_peer_loss(item["message"])] or files
    (iteration, phase_index), stuck = _behind(unfinished)
    phase = PHASES[phase_index] if phase_index >= 0 else None
    if own:
        root = min(own, key=lambda item: item["t"])
        kind = error_kind(None, root["message"])
        message = (
            f"{_first_line(root['message'])} (torchrun error file {Path(root['path']).parent.name})"
        )
    else:
        kind = "crash"
        message = f"torchrun exit codes {launch.returncodes}; rank(s) {[r.rank for r in stuck]} exited without an error report"
        if (words := last_words(row_dir)) is not None:
            message += f"; last words: {words}"
    return Classification(
        kind, iteration if phase else None, phase, tuple(rank.rank for rank in stuck), message
    )


def _watchdog_hang(
    unfinished: list[RankEvidence], launch: LaunchResult, watchdog: list[tuple[Path, str]]
) -> Classification:
    """The ranks the watchdog aborted timed out waiting; the hang is at the furthest-behind rank."""
    (iteration, phase_index), stuck = _behind(unfinished)
    phase = PHASES[phase_index] if phase_index >= 0 else None
    path, line = watchdog[0]
    where = f"iteration {iteration} {phase}" if phase else "before its first phase"
    message = (
        f"NCCL watchdog aborted {len(watchdog)} waiting rank(s): {line[:400]} "
        f"({path.parent.name}/{path.name}); rank(s) {[r.rank for r in stuck]} stopped at {where}; "
        f"torchrun exit codes {launch.returncodes}"
    )
    return Classification(
        "hang", iteration if phase else None, phase, tuple(r.rank for r in stuck), message
    )


def against_control(row: Classification, control: Classification | None) -> Classification:
    """A failed row that got further than a failed control is ``advanced-but-failed``, not a pass."""
    if control is None or row.status == "completed" or control.status == "completed":
        return row
    if row.position is None or control.position is None or row.position <= control.position:
        return row
    return Classification(
        "advanced-but-failed",
        row.iteration,
        row.phase,
        row.ranks,
        f"{row.status}: {row.message}; got further than the [] control "
        f"({control.status} at iteration {control.iteration} {control.phase})",
    )
