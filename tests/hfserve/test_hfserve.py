"""End-to-end tests of the hfserve server (examples/hfserve) with the real `openai` client."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_server import local_server

from orchestrator.hosts import LocalHost

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")


pytestmark = pytest.mark.slow

TREE = Path(__file__).resolve().parents[2] / "examples" / "hfserve"  # launched there as `python -m hfserve`, as targets do
_STATE = Path(tempfile.mkdtemp(prefix="hfserve-test-"))  # pidfiles and server logs
PROMPTS = ["def foo(self):\n    ", "import os\n", "class A:\n", "    return", "# Copyright",
           "x = [", "if __name__", '"""Docs']


@pytest.fixture(scope="session")
def model_dir(tiny_model: Path) -> Path:
    # The forge's cached default model (built once per machine by tests/conftest.py);
    # INFERGOAL_TEST_MODEL points at another model folder instead.
    if os.environ.get("INFERGOAL_TEST_MODEL"):
        return Path(os.environ["INFERGOAL_TEST_MODEL"])
    return Path(tiny_model)


def _start(model: Path, *knobs: str) -> Iterator[str]:
    with local_server(_STATE, lambda port: [sys.executable, "-m", "hfserve", "--model", str(model), "--port", str(port),
                                            *knobs], cwd=TREE) as url:
        yield url


@pytest.fixture(scope="module")
def baseline(model_dir: Path) -> Iterator[str]:
    yield from _start(model_dir)


@pytest.fixture(scope="module")
def batched(model_dir: Path) -> Iterator[str]:
    yield from _start(model_dir, "--decode-loop", "manual", "--batching", "on", "--max-batch-size", "8")


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_models_list(baseline: str, model_dir: Path) -> None:
    ids = [m.id for m in _client(baseline).models.list().data]
    assert ids == [model_dir.name]


def test_completion_non_stream(baseline: str, model_dir: Path) -> None:
    r = _client(baseline).completions.create(model=model_dir.name, prompt="def main():\n", max_tokens=7,
                                             temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    assert isinstance(r.choices[0].text, str) and r.choices[0].finish_reason == "length"


def test_completion_stream_usage(baseline: str, model_dir: Path) -> None:
    stream = _client(baseline).completions.create(
        model=model_dir.name, prompt="import sys\n", max_tokens=9, temperature=0.8, seed=1, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    token_chunks = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    assert len(token_chunks) == 9  # one chunk per token, nothing buffered
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9


def test_chat_stream(baseline: str, model_dir: Path) -> None:
    stream = _client(baseline).chat.completions.create(
        model=model_dir.name, messages=[{"role": "user", "content": "Write a function."}], max_tokens=6,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 6
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason is None) == 7  # role + 6


def test_logprobs(baseline: str, model_dir: Path) -> None:
    c = _client(baseline)
    r = c.completions.create(model=model_dir.name, prompt="def f(", max_tokens=4, temperature=0, logprobs=3,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and all(v <= 0 for v in lp.token_logprobs)
    # Greedy: the chosen token is the most likely one.
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and max(top.values()) == pytest.approx(val) and tok in top
    chat = c.chat.completions.create(model=model_dir.name, messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=3, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 for t in content)


def _reference_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    return [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_echo_teacher_forced_logprobs(baseline: str, model_dir: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    text = "def add(a, b):\n    return a + b\n"
    ids = tok(text)["input_ids"]
    ref = _reference_logprobs(model_dir, ids)
    c = _client(baseline)
    for max_tokens in (0, 1):
        r = c.completions.create(model=model_dir.name, prompt=text, max_tokens=max_tokens, echo=True, logprobs=2,
                                 temperature=0)
        lp = r.choices[0].logprobs
        assert r.choices[0].text.startswith(text)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        got = lp.token_logprobs[1:len(ids)]
        assert got == pytest.approx(ref, abs=1e-3)
        assert len(lp.tokens) == len(ids) + max_tokens
    # Token-id prompt and token-id strings (vLLM's return_tokens_as_token_ids).
    r = c.completions.create(model=model_dir.name, prompt=ids, max_tokens=0, echo=True, logprobs=1,
                             extra_body={"return_tokens_as_token_ids": True})
    lp = r.choices[0].logprobs
    assert lp.tokens == [f"token_id:{i}" for i in ids]
    assert all(k.startswith("token_id:") for d in lp.top_logprobs[1:] for k in d)
    assert lp.token_logprobs[1:] == pytest.approx(ref, abs=1e-3)


def test_errors(baseline: str, model_dir: Path) -> None:
    c = _client(baseline)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=model_dir.name, prompt="x", max_tokens=5000)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=model_dir.name, prompt="x " * 3000, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=model_dir.name, prompt="x", max_tokens=2, temperature=-1)
    req = urllib.request.Request(baseline + "/v1/completions", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 400


def test_batched_matches_unbatched(baseline: str, batched: str, model_dir: Path) -> None:
    def run(url: str, prompt: str) -> tuple[str, list[float]]:
        r = _client(url).completions.create(model=model_dir.name, prompt=prompt, max_tokens=16, temperature=0,
                                            logprobs=1, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 16
        return r.choices[0].text, r.choices[0].logprobs.token_logprobs

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: run(batched, p), PROMPTS))
    want = [run(baseline, p) for p in PROMPTS]
    for (gt, gl), (wt, wl) in zip(got, want, strict=True):
        assert gl == pytest.approx(wl, abs=1e-3)
        assert gt == wt


@pytest.fixture(scope="module")
def fast(model_dir: Path) -> Iterator[str]:
    # The fast engine (KV pool, continuous batching, chunked prefill) on the CPU: no CUDA graphs here.
    yield from _start(model_dir, "--engine", "fast", "--batching", "on", "--max-batch-size", "4",
                      "--prefill-chunk", "8", "--gc-freeze", "on")


def test_fast_engine_matches_baseline(baseline: str, fast: str, model_dir: Path) -> None:
    """Six concurrent greedy requests (more than the 4 slots, prompts longer than a chunk) through the
    fast engine give the baseline's generate() text; echo logprobs agree too."""
    def one(url: str, prompt: str) -> str:
        return _client(url).completions.create(model=model_dir.name, prompt=prompt, max_tokens=12, temperature=0,
                                               extra_body={"ignore_eos": True}).choices[0].text

    prompts = PROMPTS[:6]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda p: one(fast, p * 3), prompts))
    assert got == [one(baseline, p * 3) for p in prompts]
    body = {"prompt": "def add(a, b):\n    return a + b\n", "max_tokens": 0, "echo": True, "logprobs": 2}
    a = _client(fast).completions.create(model=model_dir.name, **body).choices[0].logprobs.token_logprobs
    b = _client(baseline).completions.create(model=model_dir.name, **body).choices[0].logprobs.token_logprobs
    assert a[0] is None and a[1:] == pytest.approx(b[1:], abs=1e-3)


def _startup_parts(line: str, prefix: str) -> dict[str, float]:
    words = line.split(prefix, 1)[1].split()
    return {k: float(v.rstrip("s")) for k, v in zip(words[::2], words[1::2], strict=True)}


@pytest.mark.parametrize("server", ["baseline", "fast"])
def test_engine_startup_breakdown(server: str, request: pytest.FixtureRequest) -> None:
    """The start-up log breaks the engine part down: one `hfserve: engine` line whose spans
    (tokenizer, CUDA, weights, and for the fast engine its build and graph capture) add up to the engine
    part of the `hfserve: startup` line."""
    url = request.getfixturevalue(server)
    log = (_STATE / f"server-{url.rsplit(':', 1)[1]}.log").read_text().splitlines()
    [engine] = [ln for ln in log if ln.startswith("hfserve: engine ")]
    [startup] = [ln for ln in log if ln.startswith("hfserve: startup ")]
    parts, whole = _startup_parts(engine, "hfserve: engine "), _startup_parts(startup, "hfserve: startup ")
    total = parts.pop("total")
    want = {"args", "tokenizer", "cuda", "load", "other"} | ({"import", "build", "kernels", "capture"} if server == "fast" else set())
    assert set(parts) == want and all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(total, abs=0.01 * len(parts))
    assert total == pytest.approx(whole["engine"], abs=0.011)
    [loaded] = [ln for ln in log if ln.startswith("hfserve: loaded ")]
    assert parts["load"] >= float(loaded.split(" in ")[1].split("s")[0]) - 0.011
    frozen = [ln for ln in log if ln.startswith("hfserve: --gc-freeze on: ")]  # the fast server's knob (its outputs:
    assert [int(ln.split()[3]) > 10_000 for ln in frozen] == ([True] if server == "fast" else [])  # the baseline's)


def test_a_deploy_through_the_standby_serves_as_a_cold_one(baseline: str, model_dir: Path, tmp_path: Path) -> None:
    """hfserve launched by LocalHost's standby interpreter (the shipped target's `preload` imported
    beforehand) answers as the cold baseline does, and its log is a cold start's, the standby's line
    first and the imports near zero."""
    from orchestrator.targets import load_target

    preload = load_target(TREE.parent / "targets" / "hfserve.toml").preload
    host = LocalHost(tmp_path)
    try:
        logs = []
        for i in range(2):
            port = host.free_port()
            proc = host.start([sys.executable, "-m", "hfserve", "--model", str(model_dir), "--port", str(port)],
                              env=None, cwd=str(TREE), log_path=tmp_path / f"s{i}.log", preload=preload)
            host.wait_healthy(f"http://127.0.0.1:{port}/health", 120, proc)
            assert proc.standby == (i == 1)
            url = f"http://127.0.0.1:{port}"
            got = _client(url).completions.create(model=model_dir.name, prompt=PROMPTS[0], max_tokens=8,
                                                  temperature=0, extra_body={"ignore_eos": True}).choices[0].text
            want = _client(baseline).completions.create(model=model_dir.name, prompt=PROMPTS[0], max_tokens=8,
                                                        temperature=0, extra_body={"ignore_eos": True}).choices[0].text
            assert got == want
            if i == 0:  # the standby imports while this server runs (a trial's gates and bench)
                deadline = time.monotonic() + 60
                while "imported" not in ((tmp_path / "servers" / "standby.log").read_text()
                                         if (tmp_path / "servers" / "standby.log").exists() else ""):
                    assert time.monotonic() < deadline, "no standby came up"
                    time.sleep(0.1)
            host.stop(proc)
            logs.append((tmp_path / f"s{i}.log").read_text().splitlines())
    finally:
        host.close()
    cold, warm = ([ln.split(" ")[:2] for ln in log if ln.startswith("hfserve:")] for log in logs)
    assert warm == cold and logs[1][0].startswith("infergoal: standby pid=")
    imports = [_startup_parts(next(ln for ln in log if ln.startswith("hfserve: startup ")), "hfserve: startup ")["imports"]
               for log in logs]
    assert imports[1] < 0.5 < imports[0], imports
