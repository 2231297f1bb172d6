"""The host side of a standby interpreter (`orchestrator.remote.standbyd`): when one may serve a launch,
starting one, and handing it the launch.

A standby serves a launch only where that is a cold start done early: the launch is
`<python> <script.py> args...` or `<python> -m <module> args...` with the standby's own interpreter and no
other interpreter flags, its
environment equals the standby's exactly (variables read at import time, such as `OMP_NUM_THREADS`,
were read with those values), the target names the same modules to preload, and none of them would
resolve to a file beside the script, or in the working directory of a `-m` launch (a cold start puts that
folder first on the import path).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.remote import standbyd as _program
from orchestrator.remote.standbyd import eligible, idle_args, lock_pipe

__all__ = ["PROGRAM", "QUIET_CORES", "Standby", "eligible", "spawn"]

PROGRAM = Path(_program.__file__).resolve()
"""The standby program, run as a script by the engine's interpreter."""

QUIET_CORES = 8
"""Usable cores from which a standby importing beside a gated or measured server is left running
(`LocalHost.quiet`, `SSHHost.quiet`): one core of eight or more is spare; on fewer it is paused."""



@dataclass
class Standby:
    """A started standby: its process, the pipe its job goes down, and what it was started for."""

    popen: subprocess.Popen
    argv: list[str]
    """Its own command line (what /proc shows for it, before and after it becomes a server)."""
    python: str
    preload: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    job_fd: int = -1
    started: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def fits(self, python: str, preload: Sequence[str], env: dict[str, str]) -> bool:
        """Whether a launch with this interpreter, module list and (full) environment may run here."""
        return python == self.python and tuple(preload) == self.preload and env == self.env

    def hand_over(self, argv: Sequence[str], env: dict[str, str], cwd: str, log_path: Path) -> None:
        """Send the launch (`argv` without the interpreter); raises OSError if the standby is gone (or
        giving up, idle: the launch then starts cold)."""
        job = json.dumps({"argv": list(argv), "env": env, "cwd": cwd, "log": str(log_path), "sent": time.time()}) + "\n"
        try:
            lock_pipe(self.job_fd)
            os.write(self.job_fd, job.encode())  # one line, well under the pipe's buffer: not split
        finally:
            self.close_pipe()

    def close_pipe(self) -> None:
        """Close the job pipe (a standby waiting on it then exits without a job)."""
        if self.job_fd >= 0:
            os.close(self.job_fd)
            self.job_fd = -1


def spawn(python: str, preload: Sequence[str], env: dict[str, str], cwd: str, log_path: Path,
          preexec_fn: Callable[[], None], idle_s: float | None = None) -> Standby:
    """Start a standby importing `preload` under `python` with exactly `env`; its own output (the
    imports' time, an import error) goes to `log_path` until it takes a job. With `idle_s` it exits
    by itself after that long without a job. Raises OSError."""
    r, w = os.pipe()
    argv = [python, str(PROGRAM), "--fd", str(r), *idle_args(idle_s), "--", *preload]
    try:
        with open(log_path, "ab") as log:
            p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, preexec_fn=preexec_fn, pass_fds=(r,))
    except OSError:
        os.close(w)
        raise
    finally:
        os.close(r)
    return Standby(popen=p, argv=argv, python=python, preload=tuple(preload), env=dict(env), job_fd=w)
