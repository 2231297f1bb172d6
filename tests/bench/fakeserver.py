"""Deterministic fake OpenAI streaming server for bench tests (no model needed).

Honours ``max_tokens``, ``ignore_eos`` (always generates max_tokens; without it, stops early at
``--eos-after`` tokens if set), ``stream_options.include_usage`` (a final usage-only chunk).
Timing: ``--ttft-ms`` before the first token, ``--tpot-ms`` between tokens.  Each token is the
word `` wN`` (one token for the whitespace tokenizer made by :func:`make_tokenizer`).
A server that varies between launches: ``--first-tpot-ms X --first-marker FILE [--first-launches K]`` (the first K at X ms).
Fault injection for failure tests: ``--fault {http500,reset,malformed,hang,usage_lie,short}`` on
every ``--fault-every`` th request (``usage_lie``: usage reports one token more than streamed;
``short``: one token fewer than asked, usage agreeing).

Caches kept across launches (in a file), for the fresh-prompt and cross-launch tests:
``--prefix-cache FILE`` an honest KV prefix cache: ``--prefill-ms`` per prompt token is paid only
for the tokens after the longest prefix (in blocks of 16) any launch prefilled; every output token
still takes ``--tpot-ms``. ``--response-cache FILE`` a cheat: a request an earlier launch answered
is replayed token by token at ``--replay-tpot-ms`` (a fast but ordinary pace) with a fresh response
id; a repeat first seen in this launch takes its first time again, so an in-launch probe sees nothing.

Run: ``python tests/bench/fakeserver.py --port 8123 --ttft-ms 20 --tpot-ms 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web

VOCAB = [f"w{i}" for i in range(100)]
STATE: web.AppKey[FakeState] = web.AppKey("state", object)  # type: ignore[arg-type]


class FakeState:
    def __init__(self, ttft_ms: float, tpot_ms: float, fault: str | None, fault_every: int,
                 eos_after: int | None, empty_first_chunk: bool) -> None:
        self.ttft_s = ttft_ms / 1000.0
        self.tpot_s = tpot_ms / 1000.0
        self.fault = fault
        self.fault_every = max(1, fault_every)
        self.eos_after = eos_after
        self.empty_first_chunk = empty_first_chunk
        self.count = 0
        self.bodies: list[dict] = []  # every request body, for tests that inspect prompts
        self.prefill_s = 0.0
        self.prefix_file: Path | None = None  # honest KV prefix cache kept across launches
        self.response_file: Path | None = None  # a response cache kept across launches (a cheat)
        self.replay_tpot_s = 0.0
        self.earlier: set[str] = set()  # what earlier launches wrote to the file

    def keep_across_launches(self, prefix_file: str = "", response_file: str = "") -> None:
        for attr, name in (("prefix_file", prefix_file), ("response_file", response_file)):
            if name:
                path = Path(name)
                setattr(self, attr, path)
                if path.exists():
                    self.earlier |= set(path.read_text().split())

    def remember(self, keys: list[str]) -> None:
        path = self.prefix_file or self.response_file
        if path is not None and keys:
            with path.open("a") as fh:
                fh.write("".join(k + "\n" for k in keys))


def _tokens(body: dict) -> list:
    """The prompt as a list of tokens (ids, or words of its text)."""
    p = body["messages"][0].get("content", "") if "messages" in body else body.get("prompt", "")
    return p if isinstance(p, list) else str(p).split()


def _key(tokens: list) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:24]


def _timing(st: FakeState, body: dict) -> tuple[float, float, list[str]]:
    """(time to the first token, time between tokens, keys to keep) for this request."""
    toks = _tokens(body)
    if st.response_file is not None:  # keyed on the whole request
        key = _key([toks, body.get("max_tokens"), bool(body.get("stream"))])
        if key in st.earlier:
            return 0.0, st.replay_tpot_s, []
        return st.ttft_s + st.prefill_s * len(toks), st.tpot_s, [key]
    if st.prefix_file is not None:  # the longest prefilled prefix, in blocks of 16
        blocks = [_key(toks[:i]) for i in range(16, len(toks) + 1, 16)]
        hit = max((16 * (i + 1) for i, k in enumerate(blocks) if k in st.earlier), default=0)
        return st.ttft_s + st.prefill_s * (len(toks) - hit), st.tpot_s, blocks
    return st.ttft_s + st.prefill_s * len(toks), st.tpot_s, []


def _prompt_len(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    p = body.get("prompt", "")
    if isinstance(p, list):
        return len(p) if (not p or isinstance(p[0], int)) else len(p[0])
    return len(str(p).split())


async def _sleep(s: float) -> None:
    if s > 0:
        await asyncio.sleep(s)


async def completions(request: web.Request) -> web.StreamResponse:
    st: FakeState = request.app[STATE]
    st.count += 1
    faulty = st.fault is not None and st.count % st.fault_every == 0
    body = await request.json()
    st.bodies.append(body)
    chat = request.path.endswith("/chat/completions")
    if faulty and st.fault == "http500":
        return web.json_response({"error": {"message": "injected"}}, status=500)
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    if not body.get("ignore_eos") and st.eos_after is not None:
        n = min(n, st.eos_after)
    if faulty and st.fault == "short":
        n -= 1
    plen = _prompt_len(body)
    rid = f"cmpl-{st.count}"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    obj = "chat.completion.chunk" if chat else "text_completion"

    lp_asked = body.get("logprobs")
    want_lp = lp_asked is not None and lp_asked is not False  # completions' logprobs=0 counts as asked

    def chunk(text: str | None, finish: str | None = None, tid: int | None = None) -> bytes:
        # With logprobs asked for, a token chunk carries its id (vLLM's return_tokens_as_token_ids shape).
        tokens = [f"token_id:{tid}"] if want_lp and tid is not None else None
        if chat:
            delta = {"content": text} if text is not None else {"role": "assistant", "content": ""}
            ch = {"index": 0, "delta": delta, "finish_reason": finish,
                  "logprobs": {"content": [{"token": t, "logprob": 0.0} for t in tokens]} if tokens else None}
        else:
            ch = {"index": 0, "text": text or "", "finish_reason": finish,
                  "logprobs": {"tokens": tokens, "token_logprobs": [0.0]} if tokens else None}
        return b"data: " + json.dumps({"id": rid, "object": obj, "created": 0, "model": body.get("model"),
                                       "choices": [ch]}).encode() + b"\n\n"

    if st.empty_first_chunk:  # like vLLM chat's role-only first chunk
        await resp.write(chunk(None))
    ttft_s, tpot_s, keep = _timing(st, body)
    await _sleep(ttft_s)
    for i in range(n):
        if i:
            await _sleep(tpot_s)
        if faulty and i == n // 2:
            if st.fault == "reset":
                request.transport.close()  # abrupt close mid-stream
                return resp
            if st.fault == "malformed":
                await resp.write(b"data: {not json\n\n")
                break
            if st.fault == "hang":
                await asyncio.sleep(3600)
        await resp.write(chunk(" " + VOCAB[i % len(VOCAB)], "length" if i == n - 1 else None, tid=i % len(VOCAB)))
    opts = body.get("stream_options") or {}
    if opts.get("include_usage"):
        told = n + 1 if faulty and st.fault == "usage_lie" else n
        usage = {"prompt_tokens": plen, "completion_tokens": told, "total_tokens": plen + told}
        await resp.write(b"data: " + json.dumps({"id": rid, "object": obj, "created": 0, "model": body.get("model"),
                                                 "choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    st.remember(keep)
    return resp


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model", "created": int(time.time()),
                                                          "owned_by": "test"}]})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(ttft_ms: float = 0.0, tpot_ms: float = 0.0, fault: str | None = None, fault_every: int = 1,
             eos_after: int | None = None, empty_first_chunk: bool = False) -> web.Application:
    app = web.Application()
    app[STATE] = FakeState(ttft_ms, tpot_ms, fault, fault_every, eos_after, empty_first_chunk)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def make_tokenizer(out_dir: str | Path) -> Path:
    """A whitespace word-level HF tokenizer whose vocabulary covers the fake server's words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2}
    for w in VOCAB + ["the", "of", "and", "to", "a", "in", "is"]:
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]")
    out = Path(out_dir)
    fast.save_pretrained(str(out))
    return out


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Poll ``url``/health until the server started as ``proc`` answers; RuntimeError if it exits first or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the server at {url} did not start") from None
            time.sleep(0.05)


@contextmanager
def launched(port: int, *args: str, script: str | Path = __file__, env: dict[str, str] | None = None) -> Iterator[str]:
    """``script`` (this server by default) on ``port`` with ``args``, in its own process until the block ends
    (its CPU is not the client's); yields its base URL once it answers."""
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port), *args], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--tpot-ms", type=float, default=0.0)
    ap.add_argument("--fault", choices=("http500", "reset", "malformed", "hang", "usage_lie", "short"), default=None)
    ap.add_argument("--fault-every", type=int, default=1)
    ap.add_argument("--eos-after", type=int, default=None)
    ap.add_argument("--empty-first-chunk", action="store_true")
    ap.add_argument("--prefill-ms", type=float, default=0.0, help="per prompt token not in the prefix cache")
    ap.add_argument("--prefix-cache", default="", help="file: an honest KV prefix cache kept across launches")
    ap.add_argument("--response-cache", default="", help="file: replay what earlier launches answered (a cheat)")
    ap.add_argument("--replay-tpot-ms", type=float, default=0.5, help="--response-cache: the replay's pace")
    ap.add_argument("--slow-once", default="", help="marker file: the first server started with it (the file is "
                    "absent) runs 3x slower between tokens, later ones at speed (a stalled screen measurement)")
    ap.add_argument("--first-tpot-ms", type=float, default=None, help="with --first-marker: the first --first-launches "
                    "servers started with it run this many ms between tokens, later ones --tpot-ms (a screen measured "
                    "on a lucky launch)")
    ap.add_argument("--first-marker", default="", help="file counting the launches for --first-tpot-ms (a line each)")
    ap.add_argument("--first-launches", type=int, default=1)
    ap.add_argument("--hold-while", default="", help="file: while it exists the server does not listen yet (a test "
                    "keeps a run's trial in flight for as long as it needs, whatever the machine's speed)")
    a = ap.parse_args()
    while a.hold_while and os.path.exists(a.hold_while):
        time.sleep(0.05)
    if a.slow_once and not os.path.exists(a.slow_once):
        open(a.slow_once, "w").close()
        a.tpot_ms *= 3
    if a.first_tpot_ms is not None and a.first_marker:
        with open(a.first_marker, "a+") as fh:
            fh.seek(0)
            if len(fh.readlines()) < a.first_launches:
                a.tpot_ms = a.first_tpot_ms
            fh.write("launch\n")
    try:  # uvloop if present: the server must not be the bottleneck in ceiling runs
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    # On SIGTERM, in-flight requests (a `hang` fault's) get 1 s, not aiohttp's 60: the host's stop would
    # wait out its whole grace (10 s) and then kill, on every hanging candidate's teardown.
    app = make_app(a.ttft_ms, a.tpot_ms, a.fault, a.fault_every, a.eos_after, a.empty_first_chunk)
    st = app[STATE]
    st.prefill_s, st.replay_tpot_s = a.prefill_ms / 1000.0, a.replay_tpot_ms / 1000.0
    st.keep_across_launches(a.prefix_cache, a.response_cache)
    web.run_app(app, host=a.host, port=a.port, print=None, access_log=None, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
