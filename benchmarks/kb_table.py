"""Measure the hfserve knob space's response surface once, with the real server and the real bench.

    python benchmarks/kb_table.py --model small=DIR --workload throughput \
        --out benchmarks/data/kb_table_small_throughput.jsonl [--baseline-every 4] [--max-minutes 60]

The table behind the replayed knowledge-base benchmark (`benchmarks/kb_replay.py`), in the style
of tabular HPO benchmarks (HPOBench, NAS-Bench): every knob set of a fixed space measured once,
then search strategies replayed against the table over many seeds.

The space is the shipped hfserve target (`examples/targets/hfserve.toml`) with `max_batch_size`
on the grid 1, 2, 4, ..., 32: 576 knob sets. Several of them launch a server that behaves the
same, because the server ignores a knob under another (`behaviour_key`, from server.py: batching
uses the manual loop and its own cache, so `decode_loop` and `kv_cache` do nothing with batching
on; `max_batch_size` does nothing with batching off; `kv_cache` only acts on `generate()`). Each
distinct behaviour (108 per model) is measured once, on a fresh server launched from the target's
own launch template, with a scenario of `orchestrator.bench` (sized down, see WORKLOADS).

Paired against load drift: baseline, N candidates, baseline, ... on the same host; a candidate's
ratio is taken against the geometric mean of the baselines just before and after it. Rows are
appended to a JSONL file as they are measured, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "examples" / "targets" / "hfserve.toml"
BATCH_GRID = (1, 2, 4, 8, 16, 32)
# The builtin scenarios at scale 1.0 with fewer requests (the table has hundreds of servers to
# measure on a shared 2-core host): throughput keeps its shape (c=8, ISL 128, OSL 32), decode
# its (c=1, ISL 32, OSL 64). Metric: output tok/s (higher) and mean TPOT (lower).
WORKLOADS: dict[str, dict[str, Any]] = {
    "throughput": {"num_requests": 16, "warmup_requests": 4},
    "decode": {"num_requests": 8, "warmup_requests": 2},
}
# A knob set whose bench takes longer than this is recorded as "slower than" the rate this bound
# implies (bfloat16 on a CPU without bf16 units takes minutes); its exact slowness never matters
# to a search for the fastest.
BENCH_CAP_S = 20.0
FOREIGN_MAX = 0.3  # cores other processes may use during a bench that counts
PRIMARY = {"throughput": ("output_throughput", 1), "decode": ("tpot_ms_mean", -1)}
METRICS = ("output_throughput", "request_throughput", "tpot_ms_mean", "ttft_ms_mean", "e2e_ms_mean",
           "completed", "failed", "duration_s")

__all__ = ["BATCH_GRID", "Measurer", "behaviour_key", "grid_target", "knob_grid", "scenario"]


def grid_target(path: Path = TARGET) -> Any:
    """The shipped hfserve target with `max_batch_size` categorical on BATCH_GRID (same default)."""
    from orchestrator.targets import load_target

    t = load_target(path)
    knobs = dict(t.knobs)
    knobs["max_batch_size"] = knobs["max_batch_size"].model_copy(
        update={"type": "categorical", "choices": list(BATCH_GRID), "low": None, "high": None, "log": False})
    return t.model_copy(update={"knobs": knobs})


def knob_grid(target: Any) -> list[dict[str, Any]]:
    names = list(target.knobs)
    return [dict(zip(names, vals, strict=True)) for vals in itertools.product(*(target.knobs[n].choices for n in names))]


def behaviour_key(knobs: dict[str, Any]) -> str:
    """The knob set with the knobs the server ignores under the others blanked (see the docstring)."""
    k = dict(knobs)
    if k["batching"] == "on":
        k["decode_loop"], k["kv_cache"] = "manual", "-"
    else:
        k["max_batch_size"] = "-"
        if k["decode_loop"] == "manual":
            k["kv_cache"] = "-"
    return json.dumps(k, sort_keys=True)


def scenario(workload: str) -> Any:
    from orchestrator.bench.scenarios import builtin_scenarios

    return builtin_scenarios(1.0)[workload].model_copy(update=WORKLOADS[workload])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float) -> str | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            return f"server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(0.2)
    return "not healthy in time"


def _cpu_snapshot(pid: int) -> tuple[float, float, float]:
    """(host busy s, server process s, this process s): /proc/stat and /proc/PID/stat in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = (sum(f[:8]) - f[3] - f[4]) / tick
    try:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        server = (int(st[11]) + int(st[12])) / tick
    except (OSError, IndexError):
        server = 0.0
    t = os.times()
    return busy, server, t.user + t.system


def _bench(target: Any, port: int, model_dir: str, workload: str, pid: int) -> dict[str, Any]:
    """One bench of a running server, with the CPU others used meanwhile (in cores)."""
    from orchestrator.bench.loadgen import run_scenario

    sc = scenario(workload)
    c0, t0 = _cpu_snapshot(pid), time.monotonic()
    out: dict[str, Any] = {}
    try:
        res = asyncio.run(asyncio.wait_for(run_scenario(f"http://127.0.0.1:{port}", target.served_model_name or "tiny", sc,
                                                        tokenizer=model_dir, timeout_s=120), BENCH_CAP_S))
        out["metrics"] = {m: round(float(res.metrics.get(m, 0.0)), 4) for m in METRICS}
        if res.failures:
            out["error"] = f"{res.failures}"
    except TimeoutError:  # a bound: all requests (warm-up included) would have needed longer
        tokens = (sc.num_requests + sc.warmup_requests) * sc.output_tokens
        out["capped"] = True
        out["metrics"] = {"output_throughput": round(tokens / BENCH_CAP_S, 4), "tpot_ms_mean": round(1000 * BENCH_CAP_S / tokens, 4)}
    c1, wall = _cpu_snapshot(pid), time.monotonic() - t0
    out["foreign_cores"] = round(max(0.0, (c1[0] - c0[0]) - (c1[1] - c0[1]) - (c1[2] - c0[2])) / wall, 3)
    return out


def measure_one(target: Any, knobs: dict[str, Any], model_dir: str, workload: str, log: Path) -> dict[str, Any]:
    """Launch one fresh server with these knobs (the target's launch template), bench it, stop it.

    A bench during which other processes used more than FOREIGN_MAX cores is redone on the same
    server (up to 3 tries; the last is kept and flagged): the project's rule, a measurement taken
    while the host was busy is not used."""
    port = _free_port()
    argv = target.render(knobs, port=port, model=model_dir, source=str(ROOT / "examples" / "hfserve"), python=sys.executable)
    t0 = time.time()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    out: dict[str, Any] = {"started": round(t0, 2), "loadavg": os.getloadavg()[0]}
    try:
        err = _wait_ready(proc, f"http://127.0.0.1:{port}", 120)
        out["ready_s"] = round(time.time() - t0, 2)
        if err:
            out["error"] = err
            return out
        for attempt in range(1, 4):
            b = _bench(target, port, model_dir, workload, proc.pid)
            out.update(b, attempts=attempt)
            if b["foreign_cores"] <= FOREIGN_MAX or b.get("error"):
                break
            time.sleep(2 * attempt)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    out["wall_s"] = round(time.time() - t0, 2)
    return out


class Measurer:
    """Appends measured rows to a JSONL table; a baseline before every `every` candidates."""

    def __init__(self, path: Path, model: str, model_dir: str, workload: str, every: int = 4) -> None:
        self.path, self.model, self.model_dir, self.workload, self.every = Path(path), model, model_dir, workload, every
        self.target = grid_target()
        self.base = self.target.baseline_knobs()
        self.since_base = every  # a baseline first
        self.log = self.path.with_suffix(".log")

    def _row(self, role: str, knobs: dict[str, Any]) -> dict[str, Any]:
        row = {"model": self.model, "workload": self.workload, "role": role, "key": behaviour_key(knobs), "knobs": knobs}
        row.update(measure_one(self.target, knobs, self.model_dir, self.workload, self.log))
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("role", "key", "ready_s", "wall_s", "error", "foreign_cores", "attempts")} |
                         {"primary": (row.get("metrics") or {}).get(PRIMARY[self.workload][0])}), flush=True)
        return row

    def candidate(self, knobs: dict[str, Any]) -> dict[str, Any]:
        if self.since_base >= self.every:
            self._row("baseline", self.base)
            self.since_base = 0
        self.since_base += 1
        return self._row("candidate", knobs)

    def close(self) -> None:
        self._row("baseline", self.base)


def host_state() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    import torch
    import transformers

    return {"cpu": cpu, "cpu_count": os.cpu_count(), "machine": platform.machine(), "loadavg": os.getloadavg(),
            "nice": os.nice(0), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="NAME=DIR (a Hugging Face-format model dir)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="throughput")
    ap.add_argument("--baseline-every", type=int, default=4)
    ap.add_argument("--max-minutes", type=float, default=90.0, help="stop starting servers after this long")
    ap.add_argument("--seed", type=int, default=0, help="measurement order")
    ap.add_argument("--out", type=Path, required=True, help="JSONL table (appended; rows already there are skipped)")
    args = ap.parse_args()
    name, model_dir = args.model.split("=", 1)
    m = Measurer(args.out, name, model_dir, args.workload, args.baseline_every)
    done = set()
    if args.out.is_file():
        done = {r["key"] for r in map(json.loads, args.out.read_text().splitlines())
                if r["role"] == "candidate" and r["model"] == name and r["workload"] == args.workload}
    distinct: dict[str, dict[str, Any]] = {}
    for k in knob_grid(m.target):
        distinct.setdefault(behaviour_key(k), k)
    todo = [k for key, k in distinct.items() if key not in done]
    random.Random(args.seed).shuffle(todo)
    with open(args.out.with_suffix(".host.json"), "a") as fh:
        fh.write(json.dumps({"command": " ".join(sys.argv), "start": host_state()}) + "\n")
    deadline = time.time() + 60 * args.max_minutes
    for k in todo:
        if time.time() > deadline:
            break
        m.candidate(k)
    m.close()
    with open(args.out.with_suffix(".host.json"), "a") as fh:
        fh.write(json.dumps({"end": host_state()}) + "\n")
    rows = [json.loads(x) for x in args.out.read_text().splitlines()]
    print(f"{sum(r['role'] == 'candidate' for r in rows)} of {len(distinct)} distinct knob sets measured; "
          f"median server wall {sorted(r.get('wall_s', 0) for r in rows)[len(rows) // 2]:.1f} s; "
          f"geomean primary {math.exp(sum(math.log(r['metrics'][PRIMARY[args.workload][0]] or 1e-9) for r in rows if r.get('metrics')) / len(rows)):.2f}")


if __name__ == "__main__":
    main()
