"""SIGINT that is never lost while a run is driven.

SIGINT is how a run is stopped cleanly (Ctrl-C, the shell's `/stop`, a pool's supervisor). Python
turns it into `KeyboardInterrupt` wherever the main thread happens to be, and a few places swallow
exceptions: an `os.register_at_fork` callback (logging's `_releaseLock`, run in the parent right
after every `subprocess.Popen`), a `__del__`, a weakref callback. A SIGINT that lands there prints
"Exception ignored in: ..." and is gone; the run then waits for a server that may never become
healthy (seen in a full test run: the signal arrived while the trial's server was being spawned).

`install()` records each SIGINT before raising; `check()`, called where the run waits (the server's
health wait, each step of the loop), raises it again when it was swallowed. While a
`KeyboardInterrupt` is already being handled (the clean-up after one), `check()` does nothing, so
tearing servers down is never interrupted twice.

SIGTERM (a supervisor's or a container's stop, `timeout` without `-s INT`) is taken as the same clean
stop while no stop is under way: the run is marked stopped and what it learned goes to the knowledge
base (`orchestrator.runs`). A SIGTERM that comes while a stop is already being handled (the shell's
escalation after a SIGINT that did not end the run in 120 s) ends the process at once, as before.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["check", "installed"]

_pending = False


def _handler(signum: int, frame: Any) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def _term(signum: int, frame: Any) -> None:
    if _pending or isinstance(sys.exc_info()[1], KeyboardInterrupt):  # a stop is under way: the default, now
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _handler(signum, frame)


def check() -> None:
    """Raise `KeyboardInterrupt` for a SIGINT whose exception was swallowed (once)."""
    global _pending
    if _pending and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
        _pending = False
        raise KeyboardInterrupt


@contextmanager
def installed() -> Iterator[None]:
    """The recording SIGINT handler, and SIGTERM taken as the same stop, for the duration of a run (the
    previous handlers restored after)."""
    global _pending
    previous = signal.signal(signal.SIGINT, _handler)
    previous_term = signal.signal(signal.SIGTERM, _term)
    _pending = False
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        _pending = False
