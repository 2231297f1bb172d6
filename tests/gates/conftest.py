"""Session fixtures for the gate tests: one forge model, its damaged copies, and real servers.

Everything expensive happens once per session: the forge model comes from the cache
(``$INFERGOAL_CACHE`` or ``~/.cache/infergoal``), damaged folders are derived from it in a tmp dir,
and all servers start *in parallel* on first use of :func:`fleet` (each takes seconds to import
torch; on 2 cores starting them one by one would dominate the run).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    # Own session so teardown can signal the server's whole process group.
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240.0) -> None:
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


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def model_name(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from orchestrator.models.forge import default_model

    return default_model()


@pytest.fixture(scope="session")
def model_variants(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Name -> folder: the honest model and every damaged copy."""
    import damage

    from orchestrator.models.forge import MODEL_INFO_FILE, cache_root, make_model

    base = tmp_path_factory.mktemp("variants")
    cfg = json.loads((model_dir / "config.json").read_text())
    theta = cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
    return {
        "honest": model_dir,
        "drop_layer": damage.drop_layer(model_dir, base / "drop_layer"),
        "quant3": damage.quantize(model_dir, base / "quant3", bits=3),
        "quant6": damage.quantize(model_dir, base / "quant6", bits=6),
        "rope": damage.wrong_rope(model_dir, base / "rope", theta=float(theta) * 10),
        "other_model": _other_model(cache_root(), make_model, MODEL_INFO_FILE),
    }


def _other_model(root: Path, make_model: Callable[..., Path], info_file: str) -> Path:
    """A different, cheaper model passed off as the declared one (other seed, a fifth of the
    training), kept in the forge cache so later sessions skip the build."""
    out = root / "gatetest-tiny-seed1-steps60"
    if not (out / info_file).exists():
        make_model(out, preset="tiny", seed=1, train_steps=60)
    return out


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


@pytest.fixture(scope="session")
def fleet(model_variants: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """Every server of SERVER_SPECS plus one cheating proxy per mode (in front of ``fp32``)."""
    if not SERVER.exists():
        pytest.skip(f"{SERVER} not present yet")
    logs = tmp_path_factory.mktemp("logs")
    started: dict[str, Served] = {}
    try:
        for name, (variant, extra) in SERVER_SPECS.items():
            port = free_port()
            # Every candidate declares the same name: a damaged model is passed off as the real one.
            argv = [sys.executable, str(SERVER), "--model", str(model_variants[variant]), "--port", str(port),
                    "--served-model-name", SERVED_NAME, *extra]
            started[name] = Served(f"http://127.0.0.1:{port}", _spawn(argv, logs / f"{name}.log"),
                                   model_variants[variant])
        for name, s in started.items():
            _wait_healthy(s.url, s.proc, logs / f"{name}.log")
            s.name = model_name(s.url)
        upstream = started["fp32"]
        for mode in PROXY_MODES:
            port = free_port()
            argv = [sys.executable, str(CHEATS), "--upstream", upstream.url, "--port", str(port), "--mode", mode,
                    "--tokenizer", str(upstream.model_dir)]
            started[f"proxy:{mode}"] = Served(f"http://127.0.0.1:{port}", _spawn(argv, logs / f"proxy-{mode}.log"),
                                              upstream.model_dir, upstream.name)
        for mode in PROXY_MODES:
            _wait_healthy(started[f"proxy:{mode}"].url, started[f"proxy:{mode}"].proc, logs / f"proxy-{mode}.log")
        yield started
    finally:
        for s in started.values():
            _stop(s.proc)
