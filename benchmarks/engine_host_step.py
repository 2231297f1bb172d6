"""Host time per decode step of hfserve's fast engine, before and after a change, in one run.

On the H200, scenario C decoded at 13.8 ms per token at batch 32 against a ~5.5 ms graph step: the
rest is host work that grows with the batch (events per token per request, the event loop's
detokenize + SSE writes, sharing the GIL with the engine thread). This measures that host side
on the CPU with the GPU taken out: the real server (hfserve, ``--engine fast``,
the forged tiny model) serves a burst of B streaming requests from a client in another process,
and the model's decode step is a stub that returns fixed ids after sleeping ``gpu_ms`` with the GIL
released, as a CUDA graph replay + the sync on its ids would. Everything else is the real code: the
engine thread's step loop (input copies, sampling, finish checks, events), the event loop's
detokenizer, SSE framing and socket writes.

Per (variant, batch, gpu_ms), over the steps where the whole burst decodes together:

* ``step_ms``: wall time from one decode step's start to the next (what the GPU would see: its step
  is ``gpu_ms``, the rest is host time and GIL waits);
* ``host_ms``: ``step_ms - gpu_ms``;
* ``cpu_ms``: the process's CPU time per step (engine thread + event loop: all of the host work);
* ``engine_cpu_ms``: the engine thread's own CPU time per step;
* ``ids_late_ms``: the median delay from a step's end to its ids back in the engine thread (the sleep's
  overshoot and the wait for the GIL);
* ``to_launch_ms``: the median time from the engine's decode call to the step's launch (where the engine
  thread waits for the GIL if the event loop took it in between);
* ``idle_ms``: the device's idle time per step, from one step's end to the next step's launch (the stub
  is asynchronous as a graph replay is: queued at once, its ids ready ``gpu_ms`` after the device is
  free, ``ids.tolist()`` waiting for them with the GIL released).

``before`` is the hfserve tree (examples/hfserve) at a git commit (``--before``, default HEAD) or a folder
holding one, ``after`` the working tree's; each runs in its own process (the tree first on its PYTHONPATH),
the client in a third.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/engine_host_step.py [--batch 16 32] [--gpu-ms 0 5.5]
        [--steps 150] [--before REF] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "examples" / "hfserve"
BEFORE = "HEAD"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- client (its own process)


async def _client(port: int, n: int, prompt: list[int], max_tokens: int) -> None:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()

    async def one() -> int:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(head + body)
        got = b""
        while chunk := await r.read(1 << 16):
            got += chunk
        w.close()
        return got.count(b"data: ")  # SSE events (HTTP chunk framing carries no such bytes)

    events = await asyncio.gather(*(one() for _ in range(n)))
    print(json.dumps({"events": events}), flush=True)


# --------------------------------------------------------------------------- server + measurement


def _serve_and_measure(hfdir: str, model: str, batch: int, gpu_ms_list: list[float], steps: int,
                       launch_us: float = 0.0, flags: list[str] | None = None, gil_ops: int = 0) -> list[dict]:
    import torch
    from aiohttp import web
    from hfserve import server as srv  # noqa: PLC0415  (the variant's own copy: hfdir is first on PYTHONPATH)

    args = srv.parse_args(["--model", model, "--port", "0", "--engine", "fast", "--batching", "on",
                           "--max-batch-size", str(batch), "--device", "cpu", "--dtype", "float32", *(flags or [])])
    eng = srv.make_engine(args)
    tok = eng.tokenizer
    words = tok("the quick brown fox jumps over the lazy dog and runs far away from home " * 8,
                add_special_tokens=False)["input_ids"]
    table = torch.tensor(words + words[:batch], dtype=torch.long)
    vocab = eng.model.config.vocab_size
    logits = {b: torch.zeros(b, vocab) for b in eng.decoder.batch_buckets}
    state = {"k": 0, "gpu_s": 0.0, "free_at": 0.0, "launch_s": launch_us / 1e6}
    scratch, scratch2 = torch.zeros(8), torch.ones(8)
    device: list[tuple[int, float, float]] = []  # (batch, launch, end) of each stub step, as a GPU would see it
    late: list[float] = []  # per step: how long after the step's end the engine thread had its ids back

    class DeviceIds:
        """The step's ids on the "device": ``tolist()`` waits (GIL released) until the step is done."""

        def __init__(self, t: torch.Tensor, done_at: float) -> None:
            self.t, self.done_at = t, done_at

        def __getitem__(self, sl):
            return DeviceIds(self.t[sl], self.done_at)

        def tolist(self) -> list[int]:
            time.sleep(max(0.0, self.done_at - time.perf_counter()))
            late.append(time.perf_counter() - self.done_at)  # the sleep's overshoot + the wait for the GIL
            return self.t.tolist()

    def stub_decode(tokens, pos, c):
        """The GPU step, asynchronous as a graph replay is: queued at once, done ``gpu_s`` after the
        device is free; the host waits only when it reads the ids."""
        if state["launch_s"]:
            time.sleep(state["launch_s"])  # the input copy + cudaGraphLaunch's host time, GIL released
        for _ in range(gil_ops):  # torch calls that drop and re-take the GIL, as a GPU step's copies and launch do
            scratch.copy_(scratch2)
        now = time.perf_counter()
        done_at = max(now, state["free_at"]) + state["gpu_s"]
        state["free_at"] = done_at
        b, k = tokens.shape[0], state["k"] % len(words)
        state["k"] += 1
        device.append((b, now, done_at))
        return logits[b], DeviceIds(table[k:k + b], done_at)

    eng.fm.decode = stub_decode
    if getattr(eng, "overlap", False):  # --overlap-schedule: the stub's ids stay on its "device"
        eng.decoder._feed = lambda prev, n: None  # the next step's inputs from them (the stub ignores inputs)
        eng.decoder.copy_out = lambda ids: ids  # their copy out: tolist() waits for the step, GIL released
    marks: list[tuple[int, float, float]] = []  # (batch, wall, engine thread cpu) at each decode start
    real_decode = eng._decode

    def timed_decode(active, *rest):
        marks.append((len(active), time.perf_counter(), time.thread_time()))
        return real_decode(active, *rest)

    eng._decode = timed_decode
    port = _free_port()
    out = []

    async def run() -> None:
        runner = web.AppRunner(srv.build_app(eng, "m"), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        for gpu_ms in gpu_ms_list:
            state["gpu_s"] = gpu_ms / 1000
            marks.clear()
            device.clear()
            late.clear()
            cpu0 = time.process_time()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--client", str(port), str(batch), str(steps + 20),
                stdout=asyncio.subprocess.PIPE)
            res, _ = await proc.communicate()
            cpu = time.process_time() - cpu0
            full = [m for m in marks if m[0] == batch][5:]  # the whole burst decoding; skip the ramp
            n = len(full) - 1
            wall = full[-1][1] - full[0][1]
            # The process's CPU over the run also counts prefill and the ramp: scale to the full steps' share.
            total_wall = marks[-1][1] - marks[0][1]
            step_ms = wall / n * 1000
            # The device's idle time between steps (from one step's end to the next one's launch).
            dev = [d for d in device if d[0] == batch][5:]
            idle = [max(0.0, b[1] - a[2]) for a, b in zip(dev, dev[1:], strict=False)]
            out.append({"batch": batch, "gpu_ms": gpu_ms, "steps": n, "step_ms": round(step_ms, 3),
                        "host_ms": round(step_ms - gpu_ms, 3),
                        "idle_ms": round(sum(idle) / max(len(idle), 1) * 1000, 3),
                        "to_launch_ms": _median_ms([d[1] - m[1] for m, d in zip(marks, device, strict=False)
                                                    if m[0] == batch]),
                        "ids_late_ms": _median_ms(late),
                        "cpu_ms": round(cpu / max(len(marks), 1) * 1000, 3),
                        "engine_cpu_ms": round((full[-1][2] - full[0][2]) / n * 1000, 3),
                        "total_wall_s": round(total_wall, 2),
                        "events_ok": json.loads(res)["events"] == [steps + 20 + 2] * batch})
        await runner.cleanup()

    asyncio.run(run())
    return out


def _median_ms(xs: list[float]) -> float | None:
    return round(sorted(xs)[len(xs) // 2] * 1000, 3) if xs else None


def _variant_dir(ref: str | None, tmp: str) -> str:
    if ref is None:
        return str(HF)
    if Path(ref).is_dir():  # a folder holding an hfserve tree (a machine without git: the device)
        return str(Path(ref).resolve())
    d = Path(tmp) / ref
    d.mkdir(parents=True)
    # Every module of the tree at that commit (the package hfserve/ and what sits beside it).
    paths = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", ref, "examples/hfserve/"], check=True,
                           capture_output=True, text=True).stdout.split()
    if "examples/hfserve/hfserve/server.py" not in paths:
        raise SystemExit(f"engine_host_step: {ref} has no hfserve package (examples/hfserve/hfserve/); pick a later commit")
    for path in (p for p in paths if p.endswith(".py")):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True,
                             capture_output=True, text=True).stdout
        out = d / Path(path).relative_to("examples/hfserve")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(src)
    return str(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--gpu-ms", type=float, nargs="+", default=[0.0, 5.5])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--launch-us", type=float, default=0.0,
                    help="the stub step's launch holds the GIL released this long first (on a GPU: the input"
                         " copy and cudaGraphLaunch, both of which release it)")
    ap.add_argument("--before", default=BEFORE, help="git ref of the 'before' hfserve folder, or a folder")
    ap.add_argument("--after-flags", default="", help="server flags for the 'after' variant only, e.g."
                    " '--overlap-schedule on' (with --before HEAD: one tree, two ways)")
    ap.add_argument("--model", default=None, help="default: the forged tiny model")
    ap.add_argument("--json", default=None)
    ap.add_argument("--client", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--flags", default="", help=argparse.SUPPRESS)
    ap.add_argument("--gil-ops", type=int, default=0, help="small torch calls per stub step (each releases and"
                    " re-takes the GIL, as the real step's copies, graph launch and event waits do)")
    a = ap.parse_args()
    if a.client:
        port, n, max_tokens = a.client
        asyncio.run(_client(port, n, [5, 17, 29, 41, 53, 65, 77, 89], max_tokens))
        return
    if a.measure:
        hfdir, batch = a.measure
        res = _serve_and_measure(hfdir, a.model, int(batch), a.gpu_ms, a.steps, a.launch_us, a.flags.split(),
                                 a.gil_ops)
        print("RESULT " + json.dumps(res), flush=True)
        return
    if a.model is None:
        from orchestrator.models import forge

        a.model = str(forge.default_model())
    before_sha = a.before if Path(a.before).is_dir() else subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", a.before], check=True, capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {"before": _variant_dir(a.before, tmp), "after": _variant_dir(None, tmp)}
        for batch in a.batch:
            for name, d in dirs.items():  # before and after back to back, per batch size
                cmd = [sys.executable, __file__, "--measure", d, str(batch), "--model", a.model, "--steps",
                       str(a.steps), "--launch-us", str(a.launch_us), "--gpu-ms", *map(str, a.gpu_ms),
                       f"--flags={a.after_flags if name == 'after' else ''}", "--gil-ops", str(a.gil_ops)]
                path = os.pathsep.join(x for x in (d, os.environ.get("PYTHONPATH")) if x)  # the variant's hfserve first
                p = subprocess.run(cmd, capture_output=True, text=True,
                                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path})
                line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                if not line:
                    raise SystemExit(f"{name} batch {batch} failed:\n{p.stderr[-3000:]}")
                for r in json.loads(line[0][7:]):
                    rows.append({"variant": name, **r})
    print(f"before = {a.before} ({before_sha}), after = the working tree {a.after_flags}; load avg {os.getloadavg()[0]:.2f}")
    print(f"{'batch':>5} {'gpu_ms':>6} | {'step_ms b/a':>15} {'host_ms b/a':>15} {'cpu_ms b/a':>15} "
          f"{'engine_cpu b/a':>15} {'idle_ms b/a':>15} {'ids_late b/a':>15} | host ratio  all events")
    for batch in a.batch:
        for g in a.gpu_ms:
            b, f = (next(r for r in rows if r["variant"] == v and r["batch"] == batch and r["gpu_ms"] == g)
                    for v in ("before", "after"))

            def pair(k: str, b: dict = b, f: dict = f) -> str:
                return f"{b[k]:7.2f}/{f[k]:<7.2f}"

            ratio = b["host_ms"] / f["host_ms"] if f["host_ms"] > 0 else float("inf")
            print(f"{batch:>5} {g:>6} | {pair('step_ms'):>15} {pair('host_ms'):>15} {pair('cpu_ms'):>15} "
                  f"{pair('engine_cpu_ms'):>15} {pair('idle_ms'):>15} {pair('ids_late_ms'):>15} | {ratio:9.2f}x  {b['events_ok'] and f['events_ok']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"before": a.before, "before_sha": before_sha, "rows": rows}, indent=1))


if __name__ == "__main__":
    threading.current_thread().name = "main"
    main()
