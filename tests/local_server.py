"""A server started as a trial starts one: by the project's own LocalHost (its own process group, a health
wait with a timeout, TERM then KILL)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.hosts import LocalHost


@contextmanager
def local_server(state: Path, argv: Callable[[int], list[str]], cwd: Path | None = None) -> Iterator[str]:
    """``argv(port)`` on a free port, its pidfile and log under ``state``, until the block ends; yields its
    base URL once /health answers (120 s at most)."""
    host = LocalHost(state)
    port = host.free_port()
    proc = host.start(argv(port), env=None, cwd=None if cwd is None else str(cwd), log_path=state / f"server-{port}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        host.wait_healthy(url + "/health", 120, proc)
        yield url
    finally:
        host.stop(proc)
