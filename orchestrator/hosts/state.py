"""The host's state around a measurement: load, CPU steal, other tenants' CPU, GPU clocks.

A benchmark number is only as good as the machine it was taken on. `snapshot()` reads cumulative
counters (Linux `/proc`, `nvidia-smi` where there is a GPU); `window(before, after)` turns two
snapshots into what happened *during* the measurement. The key number is `foreign_cpu`: the
share of all CPUs used by processes that are neither the bench client nor the server under
test. Load average alone cannot say that: it counts our own server and client too, and it is a
one-minute moving average that lags a burst of load by tens of seconds. On a host already
saturated by others, busy time cannot rise any further while the damage to our numbers still
grows with every extra runnable task. So `RunQueueSampler` also samples the run queue during the
measurement: `foreign_load` is other tenants' runnable tasks per CPU, and `contention()` turns
it into the slowdown a CPU-bound server should expect.
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "RunQueueSampler", "contention", "gpu_state", "nvidia_smi", "own_tree", "proc_cpu_s", "running_tasks", "self_cpu_s",
    "snapshot", "window",
]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_line() -> dict[str, float]:
    """Jiffies of the aggregate `cpu` line of /proc/stat, in seconds."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return {}
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    vals = [int(x) / _TICK for x in first[1:1 + len(names)]]
    return dict(zip(names, vals, strict=False))


def proc_cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds (user + system, reaped children included) used so far by `pids`."""
    total = 0.0
    for pid in pids:
        try:
            # The command name may hold spaces; fields after the closing parenthesis are fixed.
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime
    return total


def running_tasks(pids: Iterable[int]) -> int:
    """Threads of `pids` (and this process) in state R right now."""
    n = 0
    for pid in {*pids, os.getpid()}:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for t in tasks:
            try:
                if (t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R":
                    n += 1
            except (OSError, IndexError):
                pass
    return n


def _procs_running() -> int:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def self_cpu_s() -> float:
    """CPU seconds of this process (all threads): the bench client runs here."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def nvidia_smi(query: str) -> str | None:
    """`nvidia-smi <query> --format=csv,noheader,nounits`'s output; None without a working nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def own_tree(root: int | None = None) -> set[int]:
    """`root` (default: this process) and every process descended from it, from /proc's parent links."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    seen, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _number(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:  # "[N/A]" fields on some boards
        return None


def gpu_state(own_pids: Iterable[int] = (), *, smi: Any = None) -> list[dict[str, float]]:
    """Per GPU: SM clock (MHz), max SM clock, temperature (C), memory used/total (MiB), and the memory
    of our own processes (`mem_own_mib`: `own_pids` among the GPU's compute apps) and of everyone
    else (`mem_others_mib` = used - own). [] without nvidia-smi. `smi(query) -> csv text or None`.

    Our own processes hold a lot: the accuracy gate's float32 reference in the measurement process
    (28 GB for a 7B), the server under test, the model forge. They come and go with a trial or a
    resume, so only `mem_others_mib` says whether another tenant moved in."""
    smi = smi or nvidia_smi
    query = "uuid,clocks.sm,clocks.max.sm,temperature.gpu,memory.used,memory.total,utilization.gpu"
    out = smi(f"--query-gpu={query}")
    if out is None:
        return []
    own = set(own_pids)
    apps = smi("--query-compute-apps=gpu_uuid,pid,used_memory") if own else None
    own_mib: dict[str, float] = {}
    for line in (apps or "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) in own and (mib := _number(parts[2])) is not None:
            own_mib[parts[0]] = own_mib.get(parts[0], 0.0) + mib
    gpus = []
    keys = ("sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "mem_used_mib", "mem_total_mib", "util_pct")
    for line in out.strip().splitlines():
        uuid, *parts = [p.strip() for p in line.split(",")]
        gpu = {k: x for k, v in zip(keys, parts, strict=False) if (x := _number(v)) is not None}
        if "mem_used_mib" in gpu and apps is not None:  # without the apps list, whose memory it is is unknown
            gpu["mem_own_mib"] = own_mib.get(uuid, 0.0)
            gpu["mem_others_mib"] = max(gpu["mem_used_mib"] - gpu["mem_own_mib"], 0.0)
        gpus.append(gpu)
    return gpus


def snapshot(own_pids: Iterable[int] = (), *, gpus: bool = True) -> dict[str, Any]:
    """Cumulative counters now, and the run queue at this instant.

    `own_pids`: the server under test (its CPU and runnable threads are not foreign); its GPU memory,
    and that of this process and its descendants (the accuracy reference, a forge), is not others'."""
    own_pids = list(own_pids)
    try:
        load1, load5, load15 = (float(x) for x in Path("/proc/loadavg").read_text().split()[:3])
    except (OSError, ValueError):
        load1 = load5 = load15 = float("nan")
    return {
        "t": time.monotonic(), "load1": load1, "load5": load5, "load15": load15,
        "cpu_count": os.cpu_count() or 1, "cpu": _cpu_line(),
        "own_cpu_s": proc_cpu_s(own_pids), "self_cpu_s": self_cpu_s(),
        "procs_running": _procs_running(), "own_running": running_tasks(own_pids),
        "gpus": gpu_state({*own_pids, *own_tree()}) if gpus else [],
    }


class RunQueueSampler:
    """Samples `state()` (a host's `host_state` without GPUs) every `period_s` in a thread."""

    def __init__(self, state: Any, period_s: float = 0.2) -> None:
        self.state, self.period_s = state, period_s
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                st = self.state()
                if "procs_running" in st:
                    self.samples.append((int(st["procs_running"]), int(st.get("own_running", 0))))
            except Exception:  # noqa: BLE001 - a host that cannot be sampled just gives no samples
                pass
            self._stop.wait(self.period_s)

    def __enter__(self) -> RunQueueSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def loads(self, ncpu: int) -> dict[str, float]:
        """Mean runnable tasks per CPU: others' (`foreign_load`) and ours (`own_load`)."""
        if not self.samples:
            return {}
        n = len(self.samples)
        foreign = sum(max(r - o, 0) for r, o in self.samples) / n
        own = sum(max(o - 1, 0) for _, o in self.samples) / n  # minus the sampling thread itself
        return {"foreign_load": foreign / ncpu, "own_load": own / ncpu, "rq_samples": n}


def contention(foreign_load: float, own_load: float) -> float:
    """Expected slowdown of our CPU-bound work from the run queue: 1.0 while every runnable task has a CPU."""
    return max(1.0, foreign_load + own_load)


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the host did between two snapshots (fractions are of all CPUs, 0..1).

    - `busy`: all non-idle CPU time; `steal`: time the hypervisor gave to other guests;
    - `client_cpu`: this process (the bench client) as a fraction of *one* core — near 1.0 means
      the client, not the server, set the pace;
    - `foreign_cpu`: busy time minus the client's and the server's own: other tenants.
    """
    wall = max(after["t"] - before["t"], 1e-6)
    ncpu = float(after.get("cpu_count") or 1)
    b, a = before.get("cpu") or {}, after.get("cpu") or {}
    d = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in a}
    total = sum(d.values()) or wall * ncpu
    busy = total - d.get("idle", 0.0) - d.get("iowait", 0.0)
    client = after["self_cpu_s"] - before["self_cpu_s"]
    server = max(after["own_cpu_s"] - before["own_cpu_s"], 0.0)
    if not d:  # a host that reports no CPU counters: only the client's own share is known
        nan = float("nan")
        return {"wall_s": wall, "load1": after.get("load1", nan), "load5": after.get("load5", nan), "busy": nan,
                "steal": nan, "client_cpu": client / wall, "server_cpu": nan, "foreign_cpu": nan, "gpus": []}
    return {
        "wall_s": wall, "load1": after["load1"], "load5": after["load5"],
        "busy": busy / total, "steal": d.get("steal", 0.0) / total,
        "client_cpu": client / wall, "server_cpu": server / wall,
        "foreign_cpu": max(busy - client - server, 0.0) / total,
        "gpus": after.get("gpus") or [],
    }
