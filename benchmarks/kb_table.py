"""Measure the hfserve knob space's response surface once, with the real server and the real bench.

    python benchmarks/kb_table.py --model small=DIR --workload throughput \
        --out benchmarks/data/kb_table_small_throughput.jsonl [--rounds 2] [--max-minutes 60]

The table behind the replayed knowledge-base benchmark (`benchmarks/kb_replay.py`), in the style
of tabular HPO benchmarks (HPOBench, NAS-Bench): every knob set of a fixed space measured once,
then search strategies replayed against the table over many seeds.

The space is the shipped hfserve target (`examples/targets/hfserve.toml`) with `max_batch_size`
on the grid 1, 2, 4, ..., 32, every knob active: 576 knob sets (the target itself declares the knobs the
server ignores under another inactive, `when`: 108 sets of active knobs, `grid_target(conditional=True)`).
Several of them launch a server that behaves the same, because the server ignores a knob under another
(`behaviour_key`, from server.py: batching uses the manual loop and its own cache, so `decode_loop` and
`kv_cache` do nothing with batching on; `max_batch_size` does nothing with batching off; `kv_cache` only
acts on `generate()`; the batch cannot exceed the requests in flight). Each distinct behaviour
(56 for the throughput scenario, 32 for decode) is measured once, on a fresh server launched from the target's
own launch template, with a scenario of `orchestrator.bench` (sized down, see WORKLOADS).

Against load (the dev host is shared): a baseline server stays up; each candidate's fresh server
is measured in ROUNDS short blocks, with a baseline block every BASE_EVERY knob sets, each block
with the CPU other processes used meanwhile. The table's value for a knob set
(`kb_replay.Table`) is its best quiet block over the median quiet baseline block of the whole
table: a block counts as quiet when others used at most FOREIGN_MAX cores. The CPU
other processes used during each block is recorded; each knob set waits (up to a minute) for a
quiet host first (3 quiet seconds in a row, up to 5 minutes), and one measured while others used more than FOREIGN_MAX cores (`trusted`) is
measured again at the end of the pass and by the next invocation. Rows are appended to a JSONL file as they are measured,
so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
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
    "throughput": {"num_requests": 8, "warmup_requests": 2},
    "decode": {"num_requests": 4, "warmup_requests": 1},
    "prefill": {"num_requests": 4, "warmup_requests": 1},
}
ROUNDS = 3
BASE_EVERY = 3  # knob sets per baseline block (the table's baseline is the median of its quiet blocks)
# A knob set whose bench takes longer than this is recorded as "slower than" the rate this bound
# implies (bfloat16 on a CPU without bf16 units takes minutes); its exact slowness never matters
# to a search for the fastest.
BENCH_CAP_S = 25.0
FOREIGN_MAX = 0.3  # cores other processes may use during any block of a trusted measurement
CONCURRENCY = {"throughput": 8, "decode": 1, "prefill": 1}  # of the builtin scenarios (checked in `scenario`)
# torch.get_num_threads() on the 2-core host the tables were measured on (checked before measuring).
HOST_THREADS = 2
PRIMARY = {"throughput": ("output_throughput", 1), "decode": ("tpot_ms_mean", -1), "prefill": ("ttft_ms_mean", -1)}
METRICS = ("output_throughput", "request_throughput", "tpot_ms_mean", "ttft_ms_mean", "e2e_ms_mean",
           "completed", "failed", "duration_s")

__all__ = ["BATCH_GRID", "Measurer", "quiet_blocks", "trusted", "behaviour_key", "grid_target", "knob_grid", "scenario"]


FLAT_ORDER = ("dtype", "decode_loop", "batching", "max_batch_size", "kv_cache", "attn", "threads")


def grid_target(path: Path = TARGET, fixed: dict[str, Any] | None = None, conditional: bool = False) -> Any:
    """The shipped hfserve target with `max_batch_size` categorical on BATCH_GRID (same default);
    `fixed` pins knobs to one value (a smaller space, the launch template unchanged). Every knob is
    active, the ones server.py ignores included, and the cost model has no prior (576 knob sets: the
    space the replays and the proposer tests run on), unless `conditional`: then the target's own `when`
    and `prior` hold (108 sets of active knobs, the shipped space; kb_replay.py --conditional)."""
    from orchestrator.targets import load_target

    t = load_target(path)
    knobs = dict(t.knobs)
    knobs["max_batch_size"] = knobs["max_batch_size"].model_copy(
        update={"type": "categorical", "choices": list(BATCH_GRID), "low": None, "high": None, "log": False})
    for name, value in (fixed or {}).items():
        knobs[name] = knobs[name].model_copy(update={"type": "categorical", "choices": [value], "default": value,
                                                     "low": None, "high": None, "log": False})
    t = t.model_copy(update={"knobs": knobs})
    # flat: in the order the replays and tests were made in (Optuna draws knobs in this order)
    return t if conditional else flat(t, FLAT_ORDER)


def flat(target: Any, names: Any = None) -> Any:
    """`target` with every knob active (no `when`) and no cost-model prior: the flat space. `names`: these
    knobs, in this order (default: all of them, in the target's order)."""
    return target.model_copy(update={"knobs": {n: target.knobs[n].model_copy(update={"when": {}, "prior": None})
                                               for n in (names or target.knobs)}})


def knob_grid(target: Any) -> list[dict[str, Any]]:
    """Every knob set of the space; with conditional knobs, each distinct set of active knobs once."""
    from orchestrator.targets.space import active_only

    names = list(target.knobs)
    out: dict[str, dict[str, Any]] = {}
    for vals in itertools.product(*(target.knobs[n].choices for n in names)):
        k = active_only(target, dict(zip(names, vals, strict=True)))
        out.setdefault(json.dumps(k, sort_keys=True), k)
    return list(out.values())


def behaviour_key(knobs: dict[str, Any], workload: str) -> str:
    """The knob set with the knobs that change nothing under the others (and this workload) blanked.

    From server.py: batching uses the manual loop and its own cache (`decode_loop`, `kv_cache` do
    nothing with batching on); `max_batch_size` does nothing with batching off and cannot exceed
    the scenario's concurrency (the batch only holds requests in flight); `kv_cache` only acts on
    `generate()`; `threads` 0 means torch's default, which is HOST_THREADS on the measuring host.
    A knob left out (inactive in a conditional space) is at the shipped default."""
    k = _with_defaults(knobs)
    if k["batching"] == "on":
        k["decode_loop"], k["kv_cache"] = "manual", "-"
        k["max_batch_size"] = min(int(k["max_batch_size"]), CONCURRENCY[workload])
    else:
        k["max_batch_size"] = "-"
        if k["decode_loop"] == "manual":
            k["kv_cache"] = "-"
    if k["threads"] == 0:
        k["threads"] = HOST_THREADS
    return json.dumps(k, sort_keys=True)


def scenario(workload: str) -> Any:
    from orchestrator.bench.scenarios import builtin_scenarios

    sc = builtin_scenarios(1.0)[workload].model_copy(update=WORKLOADS[workload])
    assert sc.concurrency == CONCURRENCY[workload], "CONCURRENCY is out of date with the builtin scenarios"
    return sc


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


def _cpu_busy() -> float:
    """Seconds of CPU the whole host has been busy (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    try:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError):
        return 0.0


def _own_cpu(pids: list[int]) -> float:
    t = os.times()
    return t.user + t.system + sum(_proc_cpu(p) for p in pids)


@functools.cache
def _defaults() -> dict[str, Any]:
    return {n: k.default for n, k in grid_target().knobs.items()}


def _with_defaults(knobs: dict[str, Any]) -> dict[str, Any]:
    return _defaults() | dict(knobs)


def launch_argv(target: Any, knobs: dict[str, Any], port: int, model_dir: str) -> list[str]:
    """The server's argv: the knobs left out are at their defaults, and in a conditional space the inactive
    ones get no flag, as in a run (the server ignores them)."""
    from orchestrator.targets.space import active_only

    return target.render(active_only(target, _with_defaults(knobs)), port=port, model=model_dir,
                         source=str(ROOT / "examples" / "hfserve"), python=sys.executable)


class Server:
    """One hfserve server launched from the target's template; stopped with its process group."""

    def __init__(self, target: Any, knobs: dict[str, Any], model_dir: str, log: Path) -> None:
        self.port = _free_port()
        argv = launch_argv(target, knobs, self.port, model_dir)
        t0 = time.time()
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                         cwd=ROOT / "examples" / "hfserve")  # in its tree, as a trial's server runs
        self.error = _wait_ready(self.proc, self.url, 120)
        self.ready_s = round(time.time() - t0, 2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def _bench(server: Server, target: Any, model_dir: str, workload: str, pids: list[int]) -> dict[str, Any]:
    """One block of the scenario on one server, with the CPU others used meanwhile (in cores)."""
    from orchestrator.bench.loadgen import run_scenario

    sc = scenario(workload)
    busy0, own0, t0 = _cpu_busy(), _own_cpu(pids), time.monotonic()
    out: dict[str, Any] = {}
    try:
        res = asyncio.run(asyncio.wait_for(run_scenario(server.url, target.served_model_name or "tiny", sc,
                                                        tokenizer=model_dir, timeout_s=120), BENCH_CAP_S))
        out["metrics"] = {m: round(float(res.metrics.get(m, 0.0)), 4) for m in METRICS}
        if res.failures:
            out["error"] = f"{res.failures}"
    except TimeoutError:  # a bound: all requests (warm-up included) would have needed longer
        tokens = (sc.num_requests + sc.warmup_requests) * sc.output_tokens
        out["capped"] = True
        out["metrics"] = {"output_throughput": round(tokens / BENCH_CAP_S, 4), "tpot_ms_mean": round(1000 * BENCH_CAP_S / tokens, 4)}
    wall = time.monotonic() - t0
    out["foreign_cores"] = round(max(0.0, (_cpu_busy() - busy0) - (_own_cpu(pids) - own0)) / wall, 3)
    return out


def _wait_quiet(max_s: float = 300.0, probe_s: float = 1.0, need: int = 3) -> float:
    """Wait up to `max_s` until other processes used at most FOREIGN_MAX cores for `need` probes in a row."""
    t0, quiet = time.monotonic(), 0
    while time.monotonic() - t0 < max_s and quiet < need:
        busy0, own0 = _cpu_busy(), _own_cpu([])
        time.sleep(probe_s)
        quiet = quiet + 1 if (_cpu_busy() - busy0) - (_own_cpu([]) - own0) <= FOREIGN_MAX * probe_s else 0
    return round(time.monotonic() - t0, 1)


def quiet_blocks(row: dict[str, Any], side: str) -> list[float]:
    """The row's `base` or `cand` block values measured while others used at most FOREIGN_MAX cores."""
    if f"{side}_foreign" in row:
        f = row[f"{side}_foreign"]
    else:  # rows of the first format: B C B ... blocks interleaved in one list
        foreign = row.get("foreign_cores") or []
        f = foreign[0::2] if side == "base" else foreign[1::2]
    return [v for v, fv in zip(row.get(side) or [], f, strict=False) if fv <= FOREIGN_MAX]


def trusted(row: dict[str, Any]) -> bool:
    """At least one candidate block ran while other processes used at most FOREIGN_MAX cores, and none hit the cap.

    A steady foreign load does not cancel out in a ratio: with one core taken, a 2-thread server
    waits on its starved thread at every OpenMP barrier (measured: the 2-thread baseline fell from
    ~260 to 13 tok/s while a 1-thread candidate kept 818), so only quiet blocks count."""
    return "cand" in row and not row.get("capped") and bool(quiet_blocks(row, "cand"))


class Measurer:
    """Paired A/B against a baseline server kept running: base, cand, base, cand, ..., base.

    Each candidate's ratio is the geometric mean over ROUNDS of its block over the mean of the
    baseline blocks just before and after it, seconds apart, so a load change that lasts longer
    than a block cancels out. The baseline server is launched once per table (and again if it
    dies); every candidate runs on a fresh server of its own. Rows go to a JSONL file."""

    def __init__(self, path: Path, model: str, model_dir: str, workload: str, rounds: int = ROUNDS, quiet_max_s: float = 300.0) -> None:
        self.path, self.model, self.model_dir, self.workload, self.rounds = Path(path), model, model_dir, workload, rounds
        self.quiet_max_s = quiet_max_s
        self.n = 0
        self.target = grid_target()
        self.base_knobs = self.target.baseline_knobs()
        self.log = Path(tempfile.gettempdir()) / f"{self.path.stem}.server.log"  # server logs: not data
        self.base: Server | None = None

    def _baseline(self) -> Server:
        if self.base is None or self.base.proc.poll() is not None:
            self.base = Server(self.target, self.base_knobs, self.model_dir, self.log)
            if self.base.error:
                raise SystemExit(f"the baseline server did not start: {self.base.error}")
            _bench(self.base, self.target, self.model_dir, self.workload, [self.base.proc.pid])  # warm its caches
        return self.base

    def candidate(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """ROUNDS blocks on a fresh server with these knobs; a baseline block first every BASE_EVERY knob sets."""
        metric, sign = PRIMARY[self.workload]
        row: dict[str, Any] = {"model": self.model, "workload": self.workload, "key": behaviour_key(knobs, self.workload), "knobs": knobs,
                               "loadavg": os.getloadavg()[0], "started": round(time.time(), 2)}
        base = self._baseline()
        row["quiet_wait_s"] = _wait_quiet(self.quiet_max_s)
        t0 = time.time()
        cand = Server(self.target, knobs, self.model_dir, self.log)
        row["ready_s"] = cand.ready_s
        try:
            if cand.error:
                row["error"] = cand.error
            else:
                pids = [base.proc.pid, cand.proc.pid]
                b_blocks = [_bench(base, self.target, self.model_dir, self.workload, pids)] if self.n % BASE_EVERY == 0 else []
                c_blocks = [_bench(cand, self.target, self.model_dir, self.workload, pids) for _ in range(self.rounds)]
                errors = [b["error"] for b in c_blocks if b.get("error")]
                if errors:
                    row["error"] = errors[0]
                else:
                    row["base"] = [b["metrics"][metric] for b in b_blocks]
                    row["cand"] = [b["metrics"][metric] for b in c_blocks]
                    row["capped"] = any(b.get("capped") for b in c_blocks)
                row["base_foreign"] = [b["foreign_cores"] for b in b_blocks]
                row["cand_foreign"] = [b["foreign_cores"] for b in c_blocks]
        finally:
            cand.stop()
        self.n += 1
        row["wall_s"] = round(time.time() - t0, 2)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("key", "base", "cand", "ready_s", "wall_s", "error", "cand_foreign", "quiet_wait_s")}), flush=True)
        return row

    def close(self) -> None:
        if self.base is not None:
            self.base.stop()


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
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="candidate blocks per knob set (each between two baseline blocks)")
    ap.add_argument("--max-minutes", type=float, default=90.0, help="stop starting servers after this long")
    ap.add_argument("--seed", type=int, default=0, help="measurement order")
    ap.add_argument("--quiet-max-s", type=float, default=300.0, help="longest wait for a quiet host before each knob set")
    ap.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE", help="measure only the knob sets with this value")
    ap.add_argument("--out", type=Path, required=True, help="JSONL table (appended; trusted rows already there are skipped)")
    args = ap.parse_args()
    name, model_dir = args.model.split("=", 1)
    import torch

    if torch.get_num_threads() != HOST_THREADS:
        raise SystemExit(f"torch's default is {torch.get_num_threads()} threads here, the table assumes {HOST_THREADS} (HOST_THREADS)")
    m = Measurer(args.out, name, model_dir, args.workload, args.rounds, quiet_max_s=args.quiet_max_s)
    done = set()
    if args.out.is_file():
        done = {r["key"] for r in map(json.loads, args.out.read_text().splitlines())
                if r["model"] == name and r["workload"] == args.workload and trusted(r)}
    distinct: dict[str, dict[str, Any]] = {}
    fixed = {k: (int(v) if v.isdigit() else v) for k, v in (f.split("=", 1) for f in args.fix)}
    for k in knob_grid(grid_target(fixed=fixed)):
        distinct.setdefault(behaviour_key(k, args.workload), k)
    todo = [k for key, k in distinct.items() if key not in done]
    random.Random(args.seed).shuffle(todo)
    # The float32 / dynamic-cache sub-space first: on a busy host it is the part sure to be complete.
    todo.sort(key=lambda k: (k["dtype"] != "float32", k["kv_cache"] != "dynamic"))
    with open(args.out.with_suffix(".host.json"), "a") as fh:
        fh.write(json.dumps({"command": " ".join(sys.argv), "start": host_state()}) + "\n")
    deadline = time.time() + 60 * args.max_minutes
    try:
        rows = [m.candidate(k) for k in todo if time.time() < deadline]
        # a second pass over the knob sets measured while the host was busy
        again = [r["knobs"] for r in rows if not trusted(r) and not r.get("error")]
        for k in again:
            if time.time() < deadline:
                m.candidate(k)
    finally:
        m.close()
    with open(args.out.with_suffix(".host.json"), "a") as fh:
        fh.write(json.dumps({"end": host_state()}) + "\n")
    rows = [json.loads(x) for x in args.out.read_text().splitlines()]
    print(f"{len({r['key'] for r in rows})} of {len(distinct)} distinct knob sets measured, {sum(map(trusted, rows))} rows trusted; "
          f"median wall per knob set {sorted(r.get('wall_s', 0) for r in rows)[len(rows) // 2]:.1f} s")


if __name__ == "__main__":
    main()
