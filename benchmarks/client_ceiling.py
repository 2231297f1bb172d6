"""Measure the bench client's own ceiling on this machine.

Starts a trivial streaming aiohttp server (separate process, uvloop if present) that answers
every request with a fixed number of SSE content chunks after a known delay, then drives it
with ``orchestrator.bench.run_scenario``:

1. throughput: zero-delay server, short streamed responses, closed loop at high concurrency;
   reports sustained requests/s and chunks/s, and CPU seconds used by client vs server
   (whichever is near 1 CPU-second per second is the bottleneck).
2. TTFT error: server waits a known ``--ttft-ms`` before the first chunk; the client's TTFT
   minus that delay is the timing error the client (plus loopback HTTP) adds.

Usage: ``python benchmarks/client_ceiling.py [--requests 20000] [--concurrency 64] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time
import urllib.request
from pathlib import Path

from orchestrator.bench import Scenario, run_scenario  # noqa: E402
from orchestrator.remote.procs import free_port  # noqa: E402


def _serve(port: int, ttft_ms: float, chunks: int) -> None:
    """Minimal OpenAI-ish SSE server: ``chunks`` content events + usage + [DONE]."""
    from aiohttp import web

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    delay = ttft_ms / 1000.0
    pieces = [b'data: {"choices":[{"index":0,"text":" w%d"}]}\n\n' % i for i in range(chunks)]
    tail = (b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\n'
            b"data: [DONE]\n\n" % chunks)

    stamps: list[tuple[int, int]] = []  # (handler entry, first chunk write), CLOCK_MONOTONIC ns

    async def handle(request: web.Request) -> web.StreamResponse:
        t_recv = time.perf_counter_ns()
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if delay:
            await asyncio.sleep(delay)
        stamps.append((t_recv, time.perf_counter_ns()))
        for p in pieces:  # one write per chunk, as a token-by-token server would do
            await resp.write(p)
        await resp.write(tail)
        await resp.write_eof()
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(stamps)

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/stamps", stats)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _serve_raw(port: int, ttft_ms: float, chunks: int) -> None:
    """The same responses from a bare asyncio protocol (no HTTP framework on the server side).

    Stamps are taken where the bytes meet user space: when the request's first bytes arrive and
    right before the first content chunk is written. What remains between the client's TTFT and
    the server's measured delay is then the client's own overhead plus loopback, not the server
    framework's request parsing and response machinery.
    """
    delay = ttft_ms / 1000.0
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    def chunk(b: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(b), b)

    pieces = [chunk(b'data: {"choices":[{"index":0,"text":" w%d"}]}\n\n' % i) for i in range(chunks)]
    tail = chunk(b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\n'
                 b"data: [DONE]\n\n" % chunks) + b"0\r\n\r\n"
    stamps: list[tuple[int, int]] = []

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t, self.buf, self.t_first = transport, b"", None

        def data_received(self, data: bytes) -> None:
            if self.t_first is None:
                self.t_first = time.perf_counter_ns()
            self.buf += data
            while b"\r\n\r\n" in self.buf:
                hdr, rest = self.buf.split(b"\r\n\r\n", 1)
                n = 0
                for line in hdr.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        n = int(v)
                if len(rest) < n:
                    return
                self.buf, t_recv, self.t_first = rest[n:], self.t_first, (time.perf_counter_ns() if rest[n:] else None)
                asyncio.ensure_future(self.answer(hdr.split(b" ", 2)[1], t_recv))

        async def answer(self, path: bytes, t_recv: int) -> None:
            if path != b"/v1/completions":
                body = b"ok" if path == b"/health" else json.dumps(stamps).encode()
                self.t.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                return
            self.t.write(head)
            if delay:
                await asyncio.sleep(delay)
            stamps.append((t_recv, time.perf_counter_ns()))
            for p in pieces:
                self.t.write(p)
            self.t.write(tail)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


def _start(ttft_ms: float, chunks: int, raw: bool = False) -> tuple[mp.Process, str]:
    port = free_port()
    proc = mp.get_context("spawn").Process(target=_serve_raw if raw else _serve, args=(port, ttft_ms, chunks), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def _cpu_s(pid: int) -> float:
    """utime+stime of a process from /proc (Linux), seconds."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _run(url: str, sc: Scenario, use_uvloop: bool):
    factory = None
    if use_uvloop:
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as r:
        return r.run(run_scenario(url, "x", sc, timeout_s=30))


def throughput(n: int, conc: int, chunks: int, use_uvloop: bool) -> dict:
    proc, url = _start(0.0, chunks)
    try:
        sc = Scenario(name="ceiling", prompt_tokens=4, output_tokens=chunks, num_requests=n,
                      concurrency=conc, warmup_requests=200, seed=0)
        # CPU share over the whole call (prompt building + warmup included, so slightly
        # pessimistic for the client): ~1.0 means that process is the bottleneck.
        w0, c0, s0 = time.perf_counter(), time.process_time(), _cpu_s(proc.pid)
        res = _run(url, sc, use_uvloop)
        w1, c1, s1 = time.perf_counter(), time.process_time(), _cpu_s(proc.pid)
    finally:
        proc.terminate()
    m, wall = res.metrics, w1 - w0
    return {"loop": "uvloop" if use_uvloop else "asyncio", "requests": n, "concurrency": conc,
            "chunks_per_request": chunks, "failed": m["failed"], "req_per_s": m["request_throughput"],
            "chunks_per_s": m["output_throughput"], "client_cpu_per_s": (c1 - c0) / wall,
            "server_cpu_per_s": (s1 - s0) / wall, "loop_lag_ms_p99": m["loop_lag_ms_p99"]}


def ttft_error(n: int, conc: int, ttft_ms: float, use_uvloop: bool, raw: bool = False) -> dict:
    """Client TTFT minus the delay the server itself measured (entry → first write).

    perf_counter_ns is CLOCK_MONOTONIC on Linux, shared by both processes, so at concurrency 1
    (requests strictly in order) each request splits exactly into send-side latency (client
    t_sent → server entry) and receive-side latency (server first write → client sees it).
    """
    import numpy as np

    proc, url = _start(ttft_ms, 4, raw)
    warm = 20
    try:
        sc = Scenario(name="ttft", prompt_tokens=4, output_tokens=4, num_requests=n, concurrency=conc,
                      warmup_requests=warm, seed=0)
        res = _run(url, sc, use_uvloop)
        stamps = json.loads(urllib.request.urlopen(url + "/stamps", timeout=10).read())[warm:]
    finally:
        proc.terminate()
    ttft = np.array([r.ttft_ns for r in res.requests]) / 1e6
    srv = np.array([b - a for a, b in stamps]) / 1e6
    out = {"loop": "uvloop" if use_uvloop else "asyncio", "server": "raw asyncio" if raw else "aiohttp",
           "concurrency": conc, "nominal_ttft_ms": ttft_ms,
           "server_delay_ms_p50": float(np.percentile(srv, 50)), "client_ttft_ms_p50": float(np.percentile(ttft, 50)),
           "added_ms_p50": float(np.percentile(ttft, 50) - np.percentile(srv, 50)),
           "added_ms_p99": float(np.percentile(ttft, 99) - np.percentile(srv, 99)),
           "failed": res.metrics["failed"]}
    if conc == 1 and len(stamps) == len(res.requests):
        send = np.array([a - r.t_sent_ns for (a, _), r in zip(stamps, res.requests, strict=True)]) / 1e6
        recv = np.array([r.t_first_token_ns - b for (_, b), r in zip(stamps, res.requests, strict=True)]) / 1e6
        added = send + recv
        out.update({"paired_added_ms_p50": float(np.percentile(added, 50)),
                    "paired_added_ms_p99": float(np.percentile(added, 99)),
                    "send_side_ms_p50": float(np.percentile(send, 50)),
                    "recv_side_ms_p50": float(np.percentile(recv, 50))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=4, help="content chunks per response")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--ttft-requests", type=int, default=500)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        import uvloop  # noqa: F401

        loops = [False, True]
    except ImportError:
        loops = [False]
    out: dict = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                 "loadavg_before": os.getloadavg(), "throughput": [], "ttft": []}
    for uv in loops:
        out["throughput"].append(throughput(a.requests, a.concurrency, a.chunks, uv))
        print(json.dumps(out["throughput"][-1]), flush=True)
    for raw in (False, True):
        for uv in loops:
            for conc in (1, 16):
                out["ttft"].append(ttft_error(a.ttft_requests, conc, a.ttft_ms, uv, raw))
                print(json.dumps(out["ttft"][-1]), flush=True)
    out["loadavg_after"] = os.getloadavg()  # other work on the machine skews everything above
    print(json.dumps({"loadavg_before": out["loadavg_before"], "loadavg_after": out["loadavg_after"]}))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
