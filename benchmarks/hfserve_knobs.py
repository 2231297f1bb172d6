"""Measure what the hfserve knobs buy: single-request TPOT and throughput at concurrency 8.

    python benchmarks/hfserve_knobs.py [--model DIR] [--tokens 64] [--concurrency 8] [--extra]

Starts examples/hfserve once per knob set, streams requests with aiohttp, and
prints one row per configuration (plus ``--json PATH``). Without ``--model`` it uses the
forge's cached tiny model. Numbers are client-side, like the real bench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

SERVER = Path(__file__).resolve().parents[1] / "examples" / "hfserve"  # the tree, run as a program
PROMPT = "def parse_args(argv=None):\n    \"\"\"Parse the command line arguments and return a namespace.\"\"\"\n"

CONFIGS: dict[str, list[str]] = {
    "baseline": [],
    "manual": ["--decode-loop", "manual"],
    "manual+batching": ["--decode-loop", "manual", "--batching", "on", "--max-batch-size", "8"],
}
EXTRA: dict[str, list[str]] = {
    "manual+batching+eager": ["--decode-loop", "manual", "--batching", "on", "--max-batch-size", "8",
                              "--attn", "eager"],
    "manual+bf16": ["--decode-loop", "manual", "--dtype", "bfloat16"],
    "manual+threads1": ["--decode-loop", "manual", "--threads", "1"],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one(session: aiohttp.ClientSession, url: str, tokens: int) -> tuple[float, float, int]:
    """Stream one request; return (ttft_s, e2e_s, completion_tokens)."""
    body = {"model": "m", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = last = None
    n = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
            if d["choices"] and d["choices"][0]["text"]:
                last = time.perf_counter()
                ttft = ttft if ttft is not None else last - t0
    return ttft or 0.0, (last or time.perf_counter()) - t0, n


async def measure(url: str, tokens: int, concurrency: int, repeats: int) -> dict[str, float]:
    """Single-request TPOT (median of ``repeats``) and output throughput at ``concurrency``."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await _one(s, url, 4)  # warm-up
        tpots, ttfts = [], []
        for _ in range(repeats):
            ttft, e2e, n = await _one(s, url, tokens)
            tpots.append((e2e - ttft) / max(1, n - 1))
            ttfts.append(ttft)
        sem = asyncio.Semaphore(concurrency)  # closed loop: at most `concurrency` in flight

        async def gated() -> tuple[float, float, int]:
            async with sem:
                return await _one(s, url, tokens)

        t0 = time.perf_counter()
        results = await asyncio.gather(*[gated() for _ in range(2 * concurrency)])
        dur = time.perf_counter() - t0
    return {"tpot_ms": 1000 * statistics.median(tpots), "ttft_ms": 1000 * statistics.median(ttfts),
            "throughput_tok_s": sum(r[2] for r in results) / dur,
            "conc_tpot_ms": 1000 * statistics.median((r[1] - r[0]) / max(1, r[2] - 1) for r in results)}


def start_server(model: str, knobs: list[str]) -> tuple[subprocess.Popen, str]:
    """Launch the server with ``knobs`` and wait for its readiness line."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--model", model, "--port", str(port), *knobs],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:  # the server prints this once it listens
        if line.startswith("infergoal-hfserve ready"):
            return proc, f"http://127.0.0.1:{port}"
    raise RuntimeError(f"server with {knobs} exited before becoming ready")


def run_all(model: str, configs: dict[str, list[str]], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Start every server (idle ones cost no CPU), then measure them round-robin.

    Interleaving rounds and taking medians keeps a shared machine's load drift from
    favouring whichever configuration happened to run in a quiet minute.
    """
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    try:
        for name, knobs in configs.items():
            procs[name] = start_server(model, knobs)
        for _ in range(args.rounds):
            for name in configs:
                samples[name].append(asyncio.run(measure(procs[name][1], args.tokens, args.concurrency,
                                                         args.repeats)))
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(15)
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in samples.items()}


def main() -> None:
    """Run every configuration and print a table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--extra", action="store_true", help="also measure dtype/threads/attn variants")
    ap.add_argument("--only", nargs="*", default=None, help="names of configurations to run")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.model is None:
        from orchestrator.models import default_model

        args.model = str(default_model())
    configs = {**CONFIGS, **(EXTRA if args.extra else {})}
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only}
    c = args.concurrency
    print(f"{'config':<24}{'TPOT ms (c=1)':>14}{'TTFT ms (c=1)':>14}{f'tok/s (c={c})':>14}{f'TPOT ms (c={c})':>15}",
          flush=True)
    rows = run_all(args.model, configs, args)
    for name, r in rows.items():
        print(f"{name:<24}{r['tpot_ms']:>14.2f}{r['ttft_ms']:>14.2f}{r['throughput_tok_s']:>14.1f}"
              f"{r['conc_tpot_ms']:>15.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "tokens": args.tokens,
                                               "concurrency": args.concurrency, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
