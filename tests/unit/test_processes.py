"""harness.processes: a stop signal is an exit that unwinds, and one swallowed on the way is raised again."""

from __future__ import annotations

import os
import signal
import time

import pytest

from harness.processes import exit_cause, exit_if_stopped, stop_signals_as_exit


def test_a_stop_signal_swallowed_by_a_bare_except_is_raised_again_at_the_next_unit_of_work():
    # What Megatron Core does to its optional fusions' imports: `try: import ... except: ...`.
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals_as_exit():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler's SystemExit lands here
        except:  # noqa: E722, S110
            pass
        with pytest.raises(SystemExit) as stop:
            exit_if_stopped()
    assert stop.value.code == 143 and exit_cause(stop.value.code) == "SIGTERM (exit 143)"
    with stop_signals_as_exit():  # a new command starts with no stop pending
        exit_if_stopped()
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler is back
