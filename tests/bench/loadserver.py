"""A fake server whose latency grows with load: `--slots` requests are served at once, the rest wait.

Each request holds a slot for its whole life (TTFT + tokens x TPOT = the service time S), so the
server sustains at most slots / S requests per second: below that a request mostly finds a free
slot (TTFT is the server's own), above it the queue grows without end and TTFT with it. The rate
at which a TTFT limit breaks is therefore known from the settings, up to the queueing just below
capacity (`capacity()`); tests and benchmarks/slo_rate.py search for it.

Run: ``python tests/bench/loadserver.py --port 8124 --slots 4 --ttft-ms 40 --tpot-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import fakeserver  # noqa: E402
from aiohttp import web

from orchestrator.remote.procs import free_port  # noqa: E402


def capacity(slots: int, ttft_ms: float, tpot_ms: float, output_tokens: int) -> float:
    """Requests per second the server completes when always busy."""
    return slots / ((ttft_ms + (output_tokens - 1) * tpot_ms) / 1000.0)


def make_app(slots: int, ttft_ms: float, tpot_ms: float) -> web.Application:
    app = fakeserver.make_app(ttft_ms=ttft_ms, tpot_ms=tpot_ms)
    gate: list[asyncio.Semaphore] = []  # made in the serving loop

    @web.middleware
    async def one_slot_each(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if not request.path.endswith("completions"):
            return await handler(request)
        if not gate:
            gate.append(asyncio.Semaphore(slots))
        async with gate[0]:  # the handler streams the whole response before it returns
            return await handler(request)

    app.middlewares.append(one_slot_each)
    return app


@contextmanager
def running(slots: int, ttft_ms: float, tpot_ms: float) -> Iterator[str]:
    """The server in its own process (its CPU is not the client's); yields its base URL."""
    with fakeserver.launched(free_port(), "--slots", str(slots), "--ttft-ms", str(ttft_ms), "--tpot-ms", str(tpot_ms),
                             script=__file__, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}) as url:
        yield url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8124)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--tpot-ms", type=float, default=20.0)
    a = ap.parse_args()
    # In-flight requests get 1 s after SIGTERM (aiohttp's default 60 s outlives the host's 10 s stop grace).
    web.run_app(make_app(a.slots, a.ttft_ms, a.tpot_ms), host=a.host, port=a.port, print=None, access_log=None,
                shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
