"""A standby interpreter: Python with a server's heavy modules already imported, waiting for one launch.

    python standby.py --fd N [--idle S] -- torch transformers aiohttp
    python standby.py --fifo PATH [--idle S] -- torch transformers aiohttp


A deploy of a Python server (`python server.py ARGS`, `python -m package ARGS`) spends seconds importing torch and transformers
before it does any work of its own (2.6-4.2 s of a 7B deploy on the H200). The host starts
this program after a server comes up, so the next deploy finds those imports done: the host writes one
job, a JSON line `{"argv": [script, args...], "env": {...}, "cwd": "...", "log": "...", "sent": epoch s}` (or
`"argv": ["-m", module, args...]`), on the pipe
`--fd` (LocalHost: a pipe it inherited) or the named pipe `--fifo` (an SSH host, whose standby outlives the
`hostd` call that started it: `orchestrator.remote.hostd`), and this process becomes that server as `python script args...`
(or `python -m module args...`) would have started it: cwd, environment (exactly the job's), stdout and stderr
appended to the log, `sys.argv`, `sys.path[0]` the script's folder (the working directory for a module), the
script (the module, a package's `__main__`) run as `__main__`. It holds no CUDA context before the job (importing
torch creates none), so the server initialises the GPU itself, as a cold start does.

With `--idle S` a standby that got no job for S seconds exits by itself (removing its named pipe), so
one whose orchestrator died (an SSH host's outlives it) does not hold its memory until `hosts clean`.
The host holds an exclusive `flock` on its end of the pipe while it writes a job, and the standby takes
one on its end before it gives up, so a job is either read or refused (EPIPE, ENXIO or ENOENT: the host
then starts the launch cold), never lost in a pipe nobody reads.

The host uses a standby only where that is equivalent to a cold start (the same interpreter, no
interpreter flags, the same environment, the same module list; `orchestrator.hosts.standby`). Standard
library only: it runs under the engine's interpreter, and can be shipped to an SSH host with the rest
of `orchestrator.remote`.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import runpy
import select
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["eligible", "idle_args", "lock_pipe", "main"]


def eligible(argv: Sequence[str], preload: Sequence[str], cwd: str | None = None) -> bool:
    """Whether `argv` is `python script.py ...` or `python -m module ...` (run in `cwd`, default this
    process's) that a standby preloading `preload` can run as a cold start would. Read where the script
    is: on an SSH host, by `hostd`."""
    if not preload or len(argv) < 2 or "python" not in Path(argv[0]).name:
        return False
    if argv[1] == "-m":
        if len(argv) < 3 or not all(p.isidentifier() for p in argv[2].split(".")):
            return False
        here = Path(cwd or os.getcwd()).resolve()  # `python -m` puts the working directory first
    elif argv[1].startswith("-") or not argv[1].endswith(".py"):
        return False
    else:
        here = Path(cwd or os.getcwd(), argv[1]).resolve().parent
    # A module of that name beside the script would win over site-packages in a cold start.
    return not any((here / f"{m.split('.')[0]}.py").exists() or (here / m.split(".")[0]).is_dir() for m in preload)


def idle_args(idle_s: float | None) -> list[str]:
    """The standby program's `--idle S` (none: it waits until the host ends it)."""
    return [] if idle_s is None else ["--idle", repr(float(idle_s))]


def lock_pipe(fd: int, timeout_s: float = 2.0) -> None:
    """Hold the lock on the job pipe (`fd`, the host's end) for the write of a job: a standby giving up,
    idle, takes it on its end first (`_read_job`). Raises OSError if it is not free in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released as the pipe closes
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _read_job(fd: int, fifo: str | None = None, idle_s: float | None = None) -> dict | None:
    """The job line, or None when the host closed the pipe without one (it is giving the standby up) or,
    with `idle_s`, sent none for that long (this end of the pipe, and the named pipe `fifo`, are then gone)."""
    if fifo or idle_s is not None:
        # A named pipe is opened non-blocking (see `main`): a read before any writer came would say end
        # of file. select() waits for the writer's line (or for a writer that left without one: end of file).
        if not select.select([fd], [], [], idle_s)[0]:
            # Idle: give up, unless a host is writing a job right now (it holds the lock on its end while
            # it does); once this end is closed under the lock, a host's write fails instead.
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not select.select([fd], [], [], 0)[0]:
                if fifo:
                    Path(fifo).unlink(missing_ok=True)
                os.close(fd)
                print(f"infergoal standby pid={os.getpid()}: no launch came in {idle_s:g}s; it exits",
                      file=sys.stderr, flush=True)
                return None
        os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as pipe:  # closes the pipe: the server must not inherit it
        line = pipe.readline()
    return json.loads(line) if line.strip() else None


def become(job: dict) -> None:
    """Turn this process into `python job["argv"]...` with the job's cwd, environment and log."""
    log = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    if job.get("cwd"):
        os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    if job["argv"][0] == "-m":
        # As `python -m module`: the working directory first on the import path; runpy sets sys.argv[0].
        sys.argv = list(job["argv"][1:])
        sys.path[0] = os.getcwd()
    else:
        # As `python script.py`: the script's folder (symlinks resolved) first on the import path.
        sys.argv = list(job["argv"])
        sys.path[0] = os.path.dirname(os.path.realpath(job["argv"][0]))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    idle_s = None
    if len(args) > 4 and args[2] == "--idle":
        idle_s, args = float(args[3]), args[:2] + args[4:]
    if len(args) < 3 or args[0] not in ("--fd", "--fifo") or args[2] != "--":
        raise SystemExit("usage: standby.py (--fd N | --fifo PATH) [--idle S] -- MODULE...")
    fifo, modules = args[0] == "--fifo", args[3:]
    # The named pipe is opened first, before the imports: the host's non-blocking open for writing
    # fails (ENXIO) while no reader has it open, and a job sent during the imports waits in the pipe.
    fd = os.open(args[1], os.O_RDONLY | os.O_NONBLOCK) if fifo else int(args[1])
    # This file's folder is sys.path[0] now; the preloads must resolve as they would for the server
    # (site-packages), not against orchestrator/remote's modules.
    del sys.path[0]
    t0 = time.perf_counter()
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            # A module another version of the package does not have: the server would not import it
            # either. Any other import error ends the standby (the host then starts launches cold).
            if e.name is None or not name.startswith(e.name):
                raise
            missing.append(name)
    imported = time.perf_counter() - t0
    print(f"infergoal standby pid={os.getpid()}: imported {' '.join(modules)} in {imported:.2f}s"
          + (f" (not found: {' '.join(missing)})" if missing else ""), file=sys.stderr, flush=True)
    job = _read_job(fd, args[1] if fifo else None, idle_s)
    if job is None:
        return
    # How long the launch waited for this standby's imports: the job is read as soon as they are done,
    # so a job sent before then waited the rest of them (~0 s when the standby was ready first).
    waited = max(time.time() - float(job.get("sent", time.time())), 0.0)
    sys.path.insert(0, "")  # the slot `become` fills with the script's folder
    become(job)
    print(f"infergoal: standby pid={os.getpid()} took the launch {waited:.2f}s after it was sent "
          f"(its imports took {imported:.2f}s)", file=sys.stderr, flush=True)
    if job["argv"][0] == "-m":
        runpy.run_module(job["argv"][1], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(job["argv"][0], run_name="__main__")


if __name__ == "__main__":
    main()
