"""Regression checks and golden baselines for activation recompute in Megatron Core and Megatron Bridge.

Each subcommand lives in ``harness/commands/<name>.py`` and exposes ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their subcommand runs, so ``--help`` and light
commands never pay for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from harness import __version__
from harness.cpu.deferred_compile import defer_compile_before_megatron_core
from harness.errors import EXIT_USAGE, UsageError
from harness.noise import silence_known_noise
from harness.processes import exit_cause, stop_signals_as_exit, stopped_by

# subcommand -> (module under harness.commands, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "revisions": (
        "revisions",
        "report torch / Megatron Core / Bridge / TE versions and the source fingerprint",
    ),
    "labels": ("labels", "list the recompute labels the installed Megatron Core validator accepts"),
    "validate": ("validate", "validate recompute fields against the real TransformerConfig"),
    "matrix": (
        "matrix",
        "print the compatibility matrix, or --check it against the real validator",
    ),
    "probe": (
        "probe",
        "measure what each recompute label does on real Megatron Core layers, on CPU",
    ),
    "estimate": (
        "estimate",
        "per-rank retained bytes of each row of a GPU recipe, measured on CPU MCore layers",
    ),
    "plan": (
        "plan",
        "per-rank whole-step peak of each recompute row, fit to a budget, and the cheapest that fits",
    ),
    "compare": ("compare", "compare run records with a golden"),
    "noise": ("noise", "step-time noise of a sweep in rounds: warm-up, within- and between-job"),
    "analyze": ("analyze", "matched table of recompute choices against the [] control"),
    "select": ("select", "narrowest recompute boundary that fits a memory target"),
    "golden": ("golden", "refresh goldens from fresh run records"),
    "bump": (
        "bump",
        "after a Megatron Core bump: label diff, matrix drift, CPU goldens",
    ),
    "diff": (
        "diff",
        "what recompute does differently in two Megatron Core trees (labels, rules, probe values)",
    ),
    "run": ("run", "run a recipe sweep with torchrun and write run records"),
    "launch": ("launch", "write a multi-node launch script (slurm)"),
    "nightly": (
        "nightly",
        "the cases the nightly GPU tier compares, their goldens for the installed stack",
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse with our exit code for bad arguments (argparse's own is also 2, but one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="recompute-harness",
        description=__doc__.splitlines()[0],
        epilog="Run `recompute-harness COMMAND --help` for a command's options; docs/ has the guides.",
    )
    parser.add_argument("--version", action="version", version=f"recompute-harness {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported (its arguments are needed to parse).
        if name == chosen:
            _command_module(module_name).add_arguments(sp)
    return parser


def _command_module(module_name: str) -> ModuleType:
    return importlib.import_module(f"harness.commands.{module_name}")


def refuse_optimized_python() -> None:
    """Megatron Core enforces most recompute rules with ``assert``: ``python -O`` strips them all."""
    if not __debug__:
        raise UsageError(
            "Python runs with -O (or PYTHONOPTIMIZE): Megatron Core's assert-based recompute rules are "
            "stripped, so every verdict would be wrong; run without -O"
        )


class _ClosedPipeTolerant:
    """stdout that, once its reader has gone (``| head -1``), drops the rest: a reader that stopped
    reading is not a failure, so the command finishes and exits as if its output had been read."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)  # type: ignore[attr-defined]
            except BrokenPipeError:
                self._reader_went()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()  # type: ignore[attr-defined]
            except BrokenPipeError:
                self._reader_went()

    def _reader_went(self) -> None:
        self.reader_gone = True
        # Python flushes stdout again at exit; point the descriptor at /dev/null so that flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # type: ignore[attr-defined]
        os.close(devnull)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _check_step_summary() -> None:
    """``$GITHUB_STEP_SUMMARY`` is appended to after the work is done: check it first."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    path = summary if os.path.exists(summary) else os.path.dirname(os.path.abspath(summary))
    if os.path.isdir(summary) or not os.access(path, os.W_OK):
        raise UsageError(f"$GITHUB_STEP_SUMMARY {summary}: not a writable file")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    defer_compile_before_megatron_core()  # CPU adapter part 4; imports nothing now
    silence_known_noise()
    for stream in (
        sys.stdout,
        sys.stderr,
    ):  # a path the terminal cannot encode is shown escaped, not fatal
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if not isinstance(sys.stdout, _ClosedPipeTolerant):
        sys.stdout = _ClosedPipeTolerant(sys.stdout)
    try:
        refuse_optimized_python()
        _check_step_summary()
        args = build_parser(argv).parse_args(argv)
        with (
            stop_signals_as_exit()
        ):  # so every command's clean-up runs (isolated children, torchrun jobs)
            code = int(_command_module(SUBCOMMANDS[args.command][0]).run(args))
        sys.stdout.flush()
        return code
    except UsageError as exc:
        print(f"recompute-harness: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (
        OSError,
        UnicodeError,
    ) as exc:  # a write the checks could not foresee (disk full mid-write)
        print(f"recompute-harness: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("recompute-harness: interrupted", file=sys.stderr)
        return 130
    except SystemExit as stop:
        stop_signal = stopped_by(stop.code)
        if stop_signal is None:
            raise
        print(f"recompute-harness: stopped by {exit_cause(stop.code)}", file=sys.stderr)
        return 128 + stop_signal.value


if __name__ == "__main__":
    sys.exit(main())
