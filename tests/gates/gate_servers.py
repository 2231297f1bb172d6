"""Launching and stopping real servers for the gate tests (imported by conftest and tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from orchestrator.remote import procs

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "hfserve"  # the tree, run as a program (`python examples/hfserve`)
CHEATS = Path(__file__).with_name("cheats.py")
FLAWED = Path(__file__).with_name("flawed_server.py")
SERVED_NAME = "tiny"
PROXY_MODES = ("passthrough", "constant", "ignore_max_tokens", "cache", "lie_usage", "wrong_model_name")


@dataclass
class Served:
    """A running server: its URL, process and the folder it serves."""

    url: str
    proc: subprocess.Popen
    model_dir: Path
    name: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid


def free_port() -> int:
    """A port no server of this test session was given before (orchestrator.remote.procs.free_port)."""
    return procs.free_port()


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    # Own session so teardown can signal the server's whole process group.
    # The flawed server imports hfserve to patch it: the tree first on its PYTHONPATH, installed or not.
    path = os.pathsep.join(p for p in (str(SERVER), os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240.0) -> None:
    """Until `proc` answers /health at `url`; the socket listening there must be `proc`'s (its own
    session's), so a server that another process's port collision let through is never judged."""
    deadline = time.monotonic() + timeout
    port = int(url.rsplit(":", 1)[1])
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    owners = procs.listening_pids(port)
                    if owners & procs.group_pids(proc.pid):
                        return
                    if owners:
                        raise RuntimeError(f"{url} is answered by pids {sorted(owners)}, not by the server "
                                           f"started for it (pid {proc.pid}): {log.read_text()[-2000:]}")
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server at {url} not healthy in {timeout}s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def model_name(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


# name -> (variant, extra server args). fp32/unbatched is the naive baseline configuration.
SERVER_SPECS: dict[str, tuple[str, list[str]]] = {
    "fp32": ("honest", ["--dtype", "float32"]),
    "fp16": ("honest", ["--dtype", "float16"]),
    "bf16": ("honest", ["--dtype", "bfloat16"]),
    "batched": ("honest", ["--dtype", "float32", "--batching", "on"]),
    "drop_layer": ("drop_layer", ["--dtype", "float32"]),
    "quant3": ("quant3", ["--dtype", "float32"]),
    "quant6": ("quant6", ["--dtype", "float32"]),
    "rope": ("rope", ["--dtype", "float32"]),
    "other_model": ("other_model", ["--dtype", "float32"]),
}


# Honest configurations of the example server: every one must pass the accuracy gate on every seed.
HONEST = ("fp32", "fp16", "bf16", "batched", "manual", "static", "sdpa", "batched_bf16")
HONEST_SPECS: dict[str, tuple[str, list[str]]] = {
    "manual": ("honest", ["--dtype", "float32", "--decode-loop", "manual"]),
    "static": ("honest", ["--dtype", "float32", "--kv-cache", "static"]),
    "sdpa": ("honest", ["--dtype", "float32", "--attn", "sdpa"]),
    "batched_bf16": ("honest", ["--dtype", "bfloat16", "--batching", "on", "--attn", "sdpa"]),
    # The smaller model a split-path cheat generates with (never judged on its own).
    "small": ("half", ["--dtype", "float32"]),
}
# Flawed decode paths (flawed_server.py): name -> (flaw, server args).
FLAWED_SPECS: dict[str, tuple[str, list[str]]] = {
    "batch_positions": ("batch_positions", ["--dtype", "float32", "--batching", "on"]),
    "kv_quant3": ("kv_quant3", ["--dtype", "float32", "--decode-loop", "manual"]),
    "late_drop_layer": ("late_drop_layer", ["--dtype", "float32", "--decode-loop", "manual"]),
}
# Proxies the generation check must reject: name -> (mode, upstream, generator).
GEN_PROXIES: dict[str, tuple[str, str, str | None]] = {
    "proxy:split": ("split", "fp32", "small"),
    "proxy:cache_len": ("cache_len", "fp32", None),
    "proxy:cache_prefix": ("cache_prefix", "fp32", None),
    "proxy:lie_usage_stream": ("lie_usage_stream", "fp32", None),
}
# Proxies every gate passes and only the bench audit (gates/audit.py) rejects.
EVASION_PROXIES: dict[str, tuple[str, str, str | None]] = {
    "proxy:evade": ("evade", "fp32", "small"),
}
_PROXIES = {**GEN_PROXIES, **EVASION_PROXIES}


def half_model(model_dir: Path, out: Path) -> Path:
    """The model with layers 1 and 2 dropped: the "smaller model" of the split-path cheat."""
    import gate_damage

    if not (out / "config.json").exists():
        gate_damage.drop_layer(gate_damage.drop_layer(model_dir, out.with_name(out.name + "-1"), 1), out, 1)
    return out


def start_fleet(names: list[str] | tuple[str, ...], model_dir: Path, work: Path,
                existing: dict[str, Served] | None = None) -> dict[str, Served]:
    """Start the named servers/proxies (of every *_SPECS table) in parallel; proxies' upstreams too.

    Servers already in ``existing`` (a running session fleet) are reused, not started again, and
    are not in the returned dict (so :func:`stop_fleet` on it leaves them alone).
    """
    existing = existing or {}
    wanted = list(names)
    for n in list(wanted):
        if n in _PROXIES:
            wanted += [u for u in _PROXIES[n][1:] if u and u not in wanted]
    dirs = {"honest": model_dir}
    if "small" in wanted:
        dirs["half"] = half_model(model_dir, work / "half")
    started: dict[str, Served] = {}
    try:
        for name in wanted:
            if name in _PROXIES or name in existing:
                continue
            port = free_port()
            common = ["--port", str(port), "--served-model-name", SERVED_NAME]
            if name in FLAWED_SPECS:
                flaw, extra = FLAWED_SPECS[name]
                argv = [sys.executable, str(FLAWED), "--flaw", flaw, "--model", str(model_dir), *common, *extra]
                folder = model_dir
            else:
                variant, extra = {**SERVER_SPECS, **HONEST_SPECS}[name]
                folder = dirs[variant]
                argv = [sys.executable, str(SERVER), "--model", str(folder), *common, *extra]
            started[name] = Served(f"http://127.0.0.1:{port}", spawn(argv, work / f"{name}.log"), folder)
        for name, s in started.items():
            wait_healthy(s.url, s.proc, work / f"{name}.log")
            s.name = model_name(s.url)
        for name in wanted:
            if name not in _PROXIES:
                continue
            mode, upstream, generator = _PROXIES[name]
            running = {**existing, **started}
            port = free_port()
            argv = [sys.executable, str(CHEATS), "--upstream", running[upstream].url, "--port", str(port),
                    "--mode", mode, "--tokenizer", str(model_dir)]
            if generator:
                argv += ["--generator", running[generator].url]
            log = work / f"{name.replace(':', '-')}.log"
            started[name] = Served(f"http://127.0.0.1:{port}", spawn(argv, log), model_dir, SERVED_NAME)
            wait_healthy(started[name].url, started[name].proc, log)
    except BaseException:
        stop_fleet(started)
        raise
    return started


def stop_fleet(fleet: dict[str, Served]) -> None:
    for s in fleet.values():
        stop(s.proc)
