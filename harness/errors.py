"""Errors the command line turns into a one-line message and an exit code.

Anything a user can get wrong (arguments, files, pins) raises ``UsageError``: exit 2, no traceback.
"""

import os
import traceback

EXIT_OK = 0
EXIT_FAILED = 1  # a verdict: rejected config, regression, failed probe
EXIT_USAGE = 2  # bad input or refused comparison; nothing was written


class UsageError(Exception):
    """Bad input: reported on one line, exit code 2."""

    exit_code = EXIT_USAGE


def exception_summary(failed: BaseException) -> dict[str, str]:
    """An exception as the harness reports it on one line: its type, its message's first line, and
    the innermost frame in Megatron Core (else the innermost frame), where the code refused."""
    frames = traceback.extract_tb(failed.__traceback__)
    in_mcore = [f for f in frames if f"megatron{os.sep}core" in f.filename]
    frame = (in_mcore or frames)[-1] if frames else None
    where = ""
    if frame is not None:
        path = frame.filename
        cut = path.rfind(f"megatron{os.sep}core")
        where = f"{path[cut:] if cut >= 0 else path}:{frame.lineno} in {frame.name}"
    text = str(failed).strip()
    return {
        "type": type(failed).__name__,
        "message": text.splitlines()[0] if text else "",
        "where": where,
    }
