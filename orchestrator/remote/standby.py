"""A standby interpreter: Python with a server's heavy modules already imported, waiting for one launch.

    python standby.py --fd N -- torch transformers aiohttp

A deploy of a Python server (`python server.py ARGS`) spends seconds importing torch and transformers
before it does any work of its own (2.6-4.2 s of a 7B deploy on the H200, issue 23). The host starts
this program after a server comes up, so the next deploy finds those imports done: the host writes one
job, a JSON line `{"argv": [script, args...], "env": {...}, "cwd": "...", "log": "...", "sent": epoch s}`, on the pipe
`--fd`, and this process becomes that server as `python script args...` would have started it: cwd,
environment (exactly the job's), stdout and stderr appended to the log, `sys.argv`, `sys.path[0]` the
script's folder, the script run as `__main__`. It holds no CUDA context before the job (importing
torch creates none), so the server initialises the GPU itself, as a cold start does.

The host uses a standby only where that is equivalent to a cold start (the same interpreter, no
interpreter flags, the same environment, the same module list; `orchestrator.hosts.standby`). Standard
library only: it runs under the engine's interpreter, and can be shipped to an SSH host with the rest
of `orchestrator.remote`.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import time

__all__ = ["main"]


def _read_job(fd: int) -> dict | None:
    """The job line, or None when the host closed the pipe without one (it is giving the standby up)."""
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
    script = job["argv"][0]
    sys.argv = list(job["argv"])
    # As `python script.py`: the script's folder (symlinks resolved) first on the import path.
    sys.path[0] = os.path.dirname(os.path.realpath(script))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[0] != "--fd" or args[2] != "--":
        raise SystemExit("usage: standby.py --fd N -- MODULE...")
    fd, modules = int(args[1]), args[3:]
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
    job = _read_job(fd)
    if job is None:
        return
    # How long the launch waited for this standby's imports: the job is read as soon as they are done,
    # so a job sent before then waited the rest of them (~0 s when the standby was ready first).
    waited = max(time.time() - float(job.get("sent", time.time())), 0.0)
    sys.path.insert(0, "")  # the slot `become` fills with the script's folder
    become(job)
    print(f"infergoal: standby pid={os.getpid()} took the launch {waited:.2f}s after it was sent "
          f"(its imports took {imported:.2f}s)", file=sys.stderr, flush=True)
    runpy.run_path(job["argv"][0], run_name="__main__")


if __name__ == "__main__":
    main()
