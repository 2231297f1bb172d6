"""CPU burners that a test starts and stops: the load of another tenant, owned by the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class Burners:
    """`n` busy-looping processes; `start()` / `stop()` may be called any number of times."""

    def __init__(self, n: int | None = None) -> None:
        self.n = n if n is not None else 2 * (os.cpu_count() or 1) + 2
        self.procs: list[subprocess.Popen] = []
        self.started = 0

    def start(self) -> None:
        if self.procs:
            return
        self.started += 1
        # Each burner dies with whoever started it (PR_SET_PDEATHSIG): a killed test leaves no load behind.
        code = "import ctypes, signal; ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL)\nwhile True: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]

    def stop(self) -> None:
        for p in self.procs:  # only the processes this object started, by their pid
            p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=10)
        self.procs = []

    @property
    def running(self) -> bool:
        return bool(self.procs)


@contextmanager
def burning(n: int | None = None) -> Iterator[Burners]:
    b = Burners(n)
    b.start()
    try:
        yield b
    finally:
        b.stop()
