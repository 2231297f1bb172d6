"""hfserve's streaming hand-over: the worker's batched events reach the client as the same
bytes as one event per token through the plain code path (json.dumps per event, ``tok.decode``).

Fast: an in-process aiohttp app over a stub engine and the forged tiny model's tokenizer, no model.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("aiohttp")

from hfserve import engine as engine_mod  # noqa: E402
from hfserve import server as srv  # noqa: E402


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _token_ids(tok) -> list[int]:
    """Words, punctuation, newlines, a multi-byte character split across tokens and a special token."""
    ids = tok("Hello, world!\n  déjà vu — 東京 \"quoted\" \\ back\tslash", add_special_tokens=False)["input_ids"]
    special = [t for t in (tok.bos_token_id, tok.eos_token_id) if t is not None]
    return ids[:5] + special[:1] + ids[5:]


class _StubEngine:
    """Streams a fixed list of token ids for every request, ``per_wake`` of them per wake-up."""

    def __init__(self, tok, ids: list[int], per_wake: int, logprobs_top: int = 2) -> None:
        self.tokenizer, self.ids, self.per_wake, self.top = tok, ids, per_wake, logprobs_top
        self.max_len = 4096
        self.model = type("M", (), {"config": type("C", (), {"vocab_size": len(tok)})()})()

    def submit(self, req) -> None:
        def run() -> None:
            for i, t in enumerate(self.ids):
                ev = t if req.logprobs is None and i % 2 else engine_mod.TokenEvent(
                    t, -0.5 - i, [(t, -0.5 - i), (3, -7.25)][: self.top] if req.logprobs is not None else None)
                req.n_generated += 1
                req.push("token", ev)
                if (i + 1) % self.per_wake == 0:
                    engine_mod.wake([req])
            req.push("done", "length")
            engine_mod.wake([req])

        threading.Thread(target=run, daemon=True).start()


def _stream(eng, path: str, body: dict) -> bytes:
    from aiohttp.test_utils import TestClient, TestServer

    async def go() -> bytes:
        async with TestClient(TestServer(srv.build_app(eng, "m"))) as client:
            r = await client.post(path, json=body)
            assert r.status == 200
            return await r.read()

    return asyncio.run(go())


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("logprobs", [None, 2])
def test_batched_stream_bytes_equal_the_per_event_path(tok, monkeypatch, chat: bool, logprobs) -> None:
    ids = _token_ids(tok)
    monkeypatch.setattr(srv.uuid, "uuid4", lambda: type("U", (), {"hex": "0" * 32})())
    monkeypatch.setattr(srv.time, "time", lambda: 1700000000.0)
    body = {"model": "m", "max_tokens": len(ids), "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        path, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "hi"}]}
        if logprobs is not None:
            body |= {"logprobs": True, "top_logprobs": logprobs}
    else:
        path, body = "/v1/completions", {**body, "prompt": "hi"}
        if logprobs is not None:
            body |= {"logprobs": logprobs}
    if chat and tok.chat_template is None:
        pytest.skip("the tiny model's tokenizer has no chat template")
    batched = _stream(_StubEngine(tok, ids, per_wake=len(ids)), path, body)
    with monkeypatch.context() as m:  # the plain path: tok.decode, json.dumps per event, a wake per token
        m.setattr(srv, "text_decoder", lambda t: lambda x: t.decode(x, skip_special_tokens=True))
        m.setattr(srv, "sse_template", lambda payload, mark: None)
        plain = _stream(_StubEngine(tok, ids, per_wake=1), path, body)
    assert batched == plain
    assert batched.count(b"data: ") == len(ids) + 2 + 1 + chat  # tokens, finish, usage, [DONE], role
    events = [json.loads(e[6:]) for e in batched.decode().split("\n\n") if e.startswith("data: {")]
    pieces = [c.get("delta", {}).get("content") if chat else c["text"] for e in events for c in e["choices"]]
    assert "".join(p for p in pieces if p) == tok.decode(ids, skip_special_tokens=True)  # 東京 included


def test_text_decoder_is_tok_decode(tok) -> None:
    import random

    dec = srv.text_decoder(tok)
    rng = random.Random(3)
    ids = _token_ids(tok)
    windows = [ids[i:j] for i in range(len(ids)) for j in range(i, len(ids) + 1)]
    windows += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 6))] for _ in range(300)]
    assert all(dec(w) == tok.decode(w, skip_special_tokens=True) for w in windows)


def test_event_stream_batches_and_wakes_once() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        req = engine_mod.GenRequest(prompt_ids=[1], max_tokens=3, temperature=0.0, top_p=1.0, seed=None,
                                    ignore_eos=True, logprobs=None, loop=loop)
        calls = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (calls.append(a), real(*a))[1]

        def worker() -> None:
            for t in (7, 8):
                req.push("token", t)
            req.push("done", "length")
            engine_mod.wake([req])

        waiter = asyncio.ensure_future(req.events.get())
        await asyncio.sleep(0)  # the handler waits before anything is queued
        threading.Thread(target=worker).start()
        kind, ev = await asyncio.wait_for(waiter, 5)
        assert (kind, ev) == ("token", engine_mod.TokenEvent(7))  # a bare id comes out as a TokenEvent
        assert await req.events.get_batch() == [("token", 8), ("done", "length")]
        assert len(calls) == 1  # one wake-up for the three events
        req.emit("error", "boom")  # emit still wakes at once
        assert await asyncio.wait_for(req.events.get(), 5) == ("error", "boom")

    asyncio.run(go())


def test_prompt_ids_checked_as_before() -> None:
    """The token-id prompt check (C-level passes) accepts and refuses exactly
    what the per-element loop did: JSON integers only (no bools, floats, strings), each in [0, vocab)."""
    import types

    eng = types.SimpleNamespace(tokenizer=None, model=types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=10)))
    s = srv.Server(eng, "m")

    def before(p):  # the check as it was
        if not (isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)):
            return "type"
        return "range" if any(t < 0 or t >= 10 for t in p) else list(p)

    for p in ([1, 2, 9], [0], [[3, 4]], [1, True], [True], [1, 2.0], [1, "2"], [1, None], [], [-1, 2], [1, 10],
              [9, 0, 5, 5]):
        try:
            got = s._encode_prompt(p)
        except srv.BadRequest as exc:
            got = "range" if "out of range" in str(exc) else "type"
        want = before(p[0] if len(p) == 1 and isinstance(p[0], list) else p)
        assert got == want, p
