"""Errors the command line turns into a one-line message and an exit code.

Anything a user can get wrong (arguments, files, pins) raises ``UsageError``: exit 2, no traceback.
"""

EXIT_OK = 0
EXIT_FAILED = 1  # a verdict: rejected config, regression, failed probe
EXIT_USAGE = 2  # bad input or refused comparison; nothing was written


class UsageError(Exception):
    """Bad input: reported on one line, exit code 2."""

    exit_code = EXIT_USAGE
