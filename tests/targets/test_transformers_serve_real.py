"""Real `transformers serve` started from examples/targets/transformers-serve.toml: it starts, serves
/v1/completions, and the capabilities the target declares missing are really missing (so the
gates' "not judged" verdict is the truth, not a guess). Slow: it launches a server."""

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchestrator.hosts import LocalHost
from orchestrator.targets import load_target

for _mod in ("fastapi", "uvicorn", "accelerate"):  # the `test` extra installs them
    pytest.importorskip(_mod, reason="transformers serve needs fastapi, uvicorn and accelerate")
pytestmark = pytest.mark.slow
EX = Path(__file__).resolve().parents[2] / "examples" / "targets"


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_transformers_serve_declared_capabilities_are_true(tmp_path, tiny_model):
    t = load_target(EX / "transformers-serve.toml")
    host = LocalHost(tmp_path / "state")
    port = host.free_port()
    knobs = t.validate_knobs({"continuous_batching": False})
    argv = t.render(knobs, port=port, model=str(tiny_model), source=t.source)
    proc = host.start(argv, env=t.launch_env(knobs), cwd=None, log_path=tmp_path / "server.log")
    base = f"http://127.0.0.1:{port}"
    try:
        host.wait_healthy(base + t.health_path, t.ready_timeout_s, proc)
        url, model = base + "/v1/completions", str(tiny_model)
        status, reply = _post(url, {"model": model, "prompt": "The module", "max_tokens": 4, "temperature": 0})
        assert status == 200 and reply["choices"][0]["text"], reply
        assert not t.capabilities.ignore_eos
        status, reply = _post(url, {"model": model, "prompt": "The module", "max_tokens": 4, "ignore_eos": True})
        assert status == 422 and "ignore_eos" in reply, reply
        assert not t.capabilities.echo_logprobs
        status, reply = _post(url, {"model": model, "prompt": "The module", "max_tokens": 1, "echo": True, "logprobs": 2})
        assert status != 200 or not reply["choices"][0].get("logprobs"), reply  # accepted but ignored
    finally:
        host.stop(proc)
