"""examples/ibnaive/server.py (InferenceBench's naive server) on the tiny model, and the
benchmarks/gpu/ib_baseline.py run that measures it beside another server, on the CPU."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_server import local_server

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "ibnaive" / "server.py"
_STATE = Path(tempfile.mkdtemp(prefix="ibnaive-test-"))


@pytest.fixture(scope="module")
def naive(tiny_model: Path) -> Iterator[str]:
    with local_server(_STATE, lambda port: [sys.executable, str(SERVER), "--model", str(tiny_model), "--port", str(port),
                                            "--device", "cpu", "--served-model-name", "tiny"]) as url:
        yield url


def _stream(url: str, body: dict, stamps: list[float] | None = None) -> list[dict]:
    """POST a streaming request; the parsed SSE events (``stamps``: arrival time of each)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            if stamps is not None:
                stamps.append(time.monotonic())
            data = line[5:].strip()
            events.append({"done": True} if data == b"[DONE]" else json.loads(data))
    return events


def _body(n: int, **kw: object) -> dict:
    return {"model": "tiny", "prompt": "def main():\n    x = 1\n", "max_tokens": n, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **kw}


def test_streams_word_chunks_and_counts_usage(naive: str) -> None:
    ev = _stream(naive + "/v1/completions", _body(24, logprobs=0, return_tokens_as_token_ids=True))
    assert ev[-1] == {"done": True}
    final = ev[-2]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 24 and final["usage"]["prompt_tokens"] > 0
    chunks = [e for e in ev[:-2] if e["choices"][0]["finish_reason"] is None]
    ids = [int(t[9:]) for e in chunks for t in e["choices"][0]["logprobs"]["tokens"]]
    assert len(ids) == 24  # every generated token is in some chunk, by id
    assert all(v <= 0 for e in chunks for v in e["choices"][0]["logprobs"]["token_logprobs"])
    text = "".join(e["choices"][0]["text"] for e in chunks)
    assert text and len(chunks) <= 24  # the streamer's word-boundary pieces: a chunk may hold several tokens
    # The same request unstreamed says the same text and count.
    req = urllib.request.Request(naive + "/v1/completions", data=json.dumps({**_body(24), "stream": False}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    assert out["choices"][0]["text"] == text and out["usage"]["completion_tokens"] == 24


def test_chat_streams_like_ib(naive: str) -> None:
    ev = _stream(naive + "/v1/chat/completions",
                 {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
                  "ignore_eos": True})  # IB: chat streams by default
    assert ev[-1] == {"done": True} and ev[-2]["usage"]["completion_tokens"] == 10
    assert all(e["object"] == "chat.completion.chunk" for e in ev[:-1])
    assert all(e["choices"][0]["delta"].get("content") for e in ev[:-2])  # no empty pieces sent


def test_two_concurrent_requests_are_serialized(naive: str) -> None:
    stamps: list[list[float]] = [[], []]
    results: list[list[dict]] = [[], []]
    starts = [0.0, 0.0]

    def go(i: int) -> None:
        starts[i] = time.monotonic()
        results[i] = _stream(naive + "/v1/completions", _body(48), stamps[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in (0, 1)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for t in threads:
        t.join(180)
    assert all(r[-2]["usage"]["completion_tokens"] == 48 for r in results)
    first, second = sorted((0, 1), key=lambda i: stamps[i][0])
    # The second one's first chunk comes after the first one has finished ([DONE] is its last event).
    assert stamps[second][0] >= stamps[first][-1]
    with urllib.request.urlopen(naive + "/health", timeout=10) as r:
        assert json.loads(r.read())["peak_busy"] == 1  # never two generate() threads at once


def test_bench_measures_it(naive: str, tiny_model: Path) -> None:
    from orchestrator.bench.loadgen import run_scenario_sync
    from orchestrator.bench.scenarios import Scenario

    sc = Scenario(name="c", prompt_tokens=48, output_tokens=12, num_requests=3, concurrency=3, warmup_requests=0)
    res = run_scenario_sync(naive, "tiny", sc, tokenizer=str(tiny_model), timeout_s=120)
    m = res.metrics
    assert res.ok and m["completed"] == 3
    assert m["osl_mismatch"] == 0 and m["osl_short"] == 0 and m["osl_uncounted"] == 0
    assert m["isl_mismatch"] == 0 and m["total_output_tokens"] == 36 and m["tpot_ms_mean"] > 0


def test_ib_baseline_runs_both_servers(tiny_model: Path, tmp_path: Path) -> None:
    import ib_baseline

    scen = tmp_path / "s.toml"
    scen.write_text("\n".join(
        f'[{n}]\nprompt_tokens = {p}\noutput_tokens = {o}\nnum_requests = {r}\nconcurrency = {c}\nwarmup_requests = 1\n'
        for n, p, o, r, c in (("prefill", 64, 4, 2, 1), ("decode", 16, 10, 2, 1),
                              ("throughput", 16, 6, 6, 6), ("general", 32, 6, 4, 2))))
    out = tmp_path / "ib.json"
    hf = "hf={python} examples/hfserve --model {model} --port {port} --served-model-name {name}"
    rep = ib_baseline.main([str(tiny_model), "--out", str(out), "--scenarios", str(scen), "--device", "cpu",
                            "--server", hf, "--naive-cap", "throughput=3,general=2", "--ready-s", "120"])
    assert json.loads(out.read_text()) == rep
    assert list(rep["servers"]) == ["hf", "ib_naive"]
    for label, counts in (("hf", (2, 2, 6, 4)), ("ib_naive", (2, 2, 3, 2))):
        scs = rep["servers"][label]["scenarios"]
        assert [scs[n]["num_requests"] for n in ("prefill", "decode", "throughput", "general")] == list(counts)
        assert all(s["ok"] and s["metrics"]["osl_mismatch"] == 0 for s in scs.values()), scs
    assert rep["servers"]["ib_naive"]["scenarios"]["general"]["warmup_requests"] == 0
