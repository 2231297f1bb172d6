"""Launching and stopping real servers for the gate tests (imported by conftest and tests)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "hfserve" / "server.py"
CHEATS = Path(__file__).with_name("cheats.py")
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    # Own session so teardown can signal the server's whole process group.
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
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
