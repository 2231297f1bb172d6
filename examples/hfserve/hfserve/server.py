"""hfserve: a small OpenAI-compatible server on Hugging Face transformers (aiohttp).

Its defaults are deliberately as naive as InferenceBench's transformers baseline: one
request at a time, ``model.generate()`` per request with a streamer, float32. The knobs
(``--decode-loop manual``, ``--batching on``, ``--dtype``, ``--attn``, ``--kv-cache``,
``--threads``) unlock real speed, so an optimizer has something honest to find.

Usage (``python -m hfserve`` in examples/hfserve, ``python examples/hfserve`` from anywhere, or the
``hfserve`` command once installed)::

    python -m hfserve --model DIR --port 8000 [--host 127.0.0.1]
        [--served-model-name NAME] [--dtype float32|bfloat16|float16]
        [--decode-loop generate|manual] [--batching off|on] [--max-batch-size 8]
        [--kv-cache dynamic|static] [--attn eager|sdpa] [--threads N]

This file is the HTTP layer and the command line; the model work is in engine.py (and
hfserve.fast for ``--engine fast``). All model work happens on one worker thread fed by a
job queue (that queue *is* the global lock of the baseline); the aiohttp event loop only
parses, detokenizes and streams, so slow clients never stall the model.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import sys
import time
import uuid
from typing import Any

_T_START = time.perf_counter()  # the start-up timeline (``startup_line``) counts from here
from aiohttp import web  # noqa: E402

from .engine import Engine, GenRequest, ScoreRequest, TokenEvent  # noqa: E402
from .loading import Phases  # noqa: E402

_T_IMPORTED = time.perf_counter()


def startup_line(t_engine: float, t_listen: float) -> str:
    """Where the server's start-up went, in seconds from this module's first line: the imports (torch,
    transformers, aiohttp), building the engine (weights, KV pool, CUDA graphs, warm-up: the loader's
    own line says the weights' share) and opening the socket. A trial's deploy is this plus the
    interpreter's start and the launcher's readiness poll (~15 s of the H200's ~20 s deploy
    were outside the weights and not yet broken down)."""
    return (f"hfserve: startup imports {_T_IMPORTED - _T_START:.2f}s engine {t_engine - _T_IMPORTED:.2f}s "
            f"listen {t_listen - t_engine:.2f}s total {t_listen - _T_START:.2f}s")

# --------------------------------------------------------------------------- HTTP layer


class BadRequest(Exception):
    """A client error, answered with HTTP 400 and an OpenAI-style error body."""


def text_decoder(tok: Any) -> Any:
    """``ids -> tok.decode(ids, skip_special_tokens=True)``, the same text, ~10x cheaper where possible.

    For a tokenizers-backed tokenizer (transformers 5's ``TokenizersBackend``) whose ``decode`` and
    ``_decode`` are not overridden and that cleans up no spaces, transformers' decode is exactly the
    Rust tokenizer's ``decode(ids, skip_special_tokens)`` behind ~5 us of Python per call: that is
    called directly. Any other tokenizer (or transformers version) goes through ``tok.decode``.
    """
    slow = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return slow
    backend = getattr(tok, "_tokenizer", None)
    if (isinstance(tok, TokenizersBackend) and backend is not None
            and type(tok).decode is PreTrainedTokenizerBase.decode
            and type(tok)._decode is TokenizersBackend._decode
            and getattr(tok, "clean_up_tokenization_spaces", True) is False):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return slow


def sse_template(payload: dict, mark: str) -> tuple[bytes, bytes] | None:
    """The SSE event of ``payload`` split around the JSON string ``mark`` (a field's value in it), so
    ``pre + json.dumps(text).encode() + post == _sse(payload with text in place of mark)``, byte for
    byte; None if ``mark`` is not found exactly once (the caller then builds each event whole)."""
    parts = _sse(payload).split(json.dumps(mark).encode())
    return (parts[0], parts[1]) if len(parts) == 2 else None


class Detok:
    """Incremental detokenizer (the prefix/read-offset scheme of TGI/vLLM).

    Decoding only a short window per token keeps streaming O(1) per token and never
    emits half of a multi-byte character.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.decode = text_decoder(tokenizer)
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def add(self, token_id: int) -> str:
        """Add one token and return the newly completed text (possibly empty)."""
        self.ids.append(token_id)
        prefix_text = self.decode(self.ids[self.prefix:self.read])
        new_text = self.decode(self.ids[self.prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""


def _sse(payload: dict) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _error(status: int, message: str, etype: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": etype, "param": None, "code": status}},
                             status=status)


class Server:
    """aiohttp handlers for the OpenAI-compatible endpoints."""

    def __init__(self, engine: Engine, served_name: str) -> None:
        self.engine = engine
        self.tok = engine.tokenizer
        self.name = served_name
        self._tokstr: dict[int, str] = {}

    # -- helpers ---------------------------------------------------------------------

    def tok_str(self, tid: int, as_ids: bool) -> str:
        """Token string for logprobs: decoded text, or ``token_id:N`` (vLLM's convention)."""
        if as_ids:
            return f"token_id:{tid}"
        s = self._tokstr.get(tid)
        if s is None:
            s = self._tokstr[tid] = self.tok.decode([tid])
        return s

    def _encode_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return list(self.tok(prompt)["input_ids"])
        # Token ids: every element a JSON integer (not a bool), each in the vocabulary. Checked with C-level
        # passes (set of types, min, max): ~0.6 ms less per 4096-token prompt than a Python loop, on A's TTFT.
        if isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:
            vocab = self.engine.model.config.vocab_size
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise BadRequest("prompt token id out of range")
            return list(prompt)
        raise BadRequest("prompt must be a non-empty string or a list of token ids (batched prompts are not supported)")

    def _params(self, body: dict, prompt_ids: list[int], default_max: int | None) -> dict[str, Any]:
        if body.get("n", 1) != 1:
            raise BadRequest("only n=1 is supported")
        room = self.engine.max_len - len(prompt_ids)
        if room < 0:
            raise BadRequest(f"prompt has {len(prompt_ids)} tokens; the maximum context length is {self.engine.max_len}")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = min(default_max, room) if default_max is not None else room
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise BadRequest("max_tokens must be a non-negative integer")
        if max_tokens > room:
            raise BadRequest(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the maximum context "
                f"length {self.engine.max_len}"
            )
        temperature = body.get("temperature", 1.0)
        top_p = body.get("top_p", 1.0)
        seed = body.get("seed")
        try:
            temperature = 1.0 if temperature is None else float(temperature)
            top_p = 1.0 if top_p is None else float(top_p)
        except (TypeError, ValueError) as exc:
            raise BadRequest("temperature and top_p must be numbers") from exc
        if temperature < 0 or not (0 < top_p <= 1) or math.isnan(temperature):
            raise BadRequest("temperature must be >= 0 and top_p in (0, 1]")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise BadRequest("seed must be an integer")
        return {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed,
                "ignore_eos": bool(body.get("ignore_eos", False))}

    async def _body(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    # -- endpoints -------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.name, "object": "model", "created": int(time.time()), "owned_by": "infergoal",
            "max_model_len": self.engine.max_len}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            if "prompt" not in body:
                raise BadRequest("missing 'prompt'")
            prompt_ids = self._encode_prompt(body["prompt"])
            params = self._params(body, prompt_ids, default_max=16)
            lp = body.get("logprobs")
            if lp is not None and (not isinstance(lp, int) or isinstance(lp, bool) or lp < 0 or lp > 20):
                raise BadRequest("logprobs must be an integer in [0, 20]")
        except BadRequest as exc:
            return _error(400, str(exc))
        return await self._serve(request, body, prompt_ids, params, chat=False, logprobs=lp,
                                 echo=bool(body.get("echo", False)))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise BadRequest("'messages' must be a non-empty list of objects")
            for m in messages:
                if isinstance(m.get("content"), list):  # content parts: keep the text ones
                    m["content"] = "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))
            text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt_ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
            params = self._params(body, prompt_ids, default_max=None)
            lp = None
            if body.get("logprobs"):
                lp = body.get("top_logprobs") or 0
                if not isinstance(lp, int) or lp < 0 or lp > 20:
                    raise BadRequest("top_logprobs must be an integer in [0, 20]")
        except BadRequest as exc:
            return _error(400, str(exc))
        return await self._serve(request, body, prompt_ids, params, chat=True, logprobs=lp, echo=False)

    async def _serve(self, request: web.Request, body: dict, prompt_ids: list[int], params: dict, *,
                     chat: bool, logprobs: int | None, echo: bool) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        as_ids = bool(body.get("return_tokens_as_token_ids", False))
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))

        # Echo: prompt log-probabilities by a single teacher-forced forward pass.
        echo_lp: dict[str, list] | None = None
        if echo:
            if logprobs is not None:
                fut = loop.create_future()
                self.engine.submit(ScoreRequest(prompt_ids, logprobs, loop, fut))
                try:
                    chosen, top = await fut
                except Exception as exc:
                    return _error(500, f"scoring failed: {exc}", "server_error")
                echo_lp = self._legacy_prompt_logprobs(prompt_ids, chosen, top, as_ids)

        req = None
        if params["max_tokens"] > 0:
            req = GenRequest(prompt_ids=prompt_ids, logprobs=logprobs, loop=loop, **params)
            self.engine.submit(req)

        obj = "chat.completion.chunk" if chat else "text_completion"
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)

        async def send(payload: dict) -> None:
            await resp.write(_sse(payload))

        text_parts: list[str] = []
        tokens: list[TokenEvent] = []
        pieces: list[str] = []
        finish = "length"
        detok = Detok(self.tok)
        prompt_text = ""
        if echo:
            prompt_text = body["prompt"] if isinstance(body["prompt"], str) else self.tok.decode(prompt_ids)
        try:
            if stream and chat:
                await send({"id": rid, "object": obj, "created": created, "model": self.name, "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]})
            if stream and not chat and echo:
                await send({"id": rid, "object": obj, "created": created, "model": self.name, "choices": [
                    {"index": 0, "text": prompt_text, "logprobs": echo_lp, "finish_reason": None}]})
            tmpl = None
            if stream and logprobs is None:
                mark = "\x00piece\x00"
                choice = ({"index": 0, "delta": {"content": mark}, "logprobs": None, "finish_reason": None} if chat
                          else {"index": 0, "text": mark, "logprobs": None, "finish_reason": None})
                tmpl = sse_template({"id": rid, "object": obj, "created": created, "model": self.name,
                                     "choices": [choice]}, mark)
            # Everything the worker queued since the last wake-up is handled at once: one SSE event
            # per token as before (same bytes, same chunking), written to the socket in one call.
            done = req is None
            while not done:
                out: list[bytes] = []
                failed = None
                for kind, payload in await req.events.get_batch():
                    if kind == "error":
                        failed = payload
                        break
                    if kind == "done":
                        finish, done = payload, True
                        break
                    ev: TokenEvent = payload if isinstance(payload, TokenEvent) else TokenEvent(payload)
                    piece = detok.add(ev.token_id)
                    tokens.append(ev)
                    pieces.append(piece)
                    text_parts.append(piece)
                    if tmpl is not None:  # no logprobs: the event's constant bytes are built once
                        out.append(tmpl[0] + json.dumps(piece).encode() + tmpl[1])
                    elif stream:
                        lp_obj = self._lp_obj([ev], [piece], chat, as_ids, 0) if logprobs is not None else None
                        if chat:
                            choice = {"index": 0, "delta": {"content": piece}, "logprobs": lp_obj,
                                      "finish_reason": None}
                        else:
                            choice = {"index": 0, "text": piece, "logprobs": lp_obj, "finish_reason": None}
                        out.append(_sse({"id": rid, "object": obj, "created": created, "model": self.name,
                                         "choices": [choice]}))
                if out:
                    await resp.write(b"".join(out))
                if failed is not None:
                    raise RuntimeError(failed)
        except (ConnectionResetError, asyncio.CancelledError):
            if req is not None:
                req.cancelled = True
            raise
        except RuntimeError as exc:
            if req is not None:
                req.cancelled = True
            if not stream:
                return _error(500, str(exc), "server_error")
            await send({"error": {"message": str(exc), "type": "server_error", "code": 500}})
            await resp.write(b"data: [DONE]\n\n")
            return resp

        n_out = req.n_generated if req is not None else 0
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out,
                 "total_tokens": len(prompt_ids) + n_out}
        print(f"hfserve {rid} prompt={len(prompt_ids)} out={n_out} finish={finish} stream={stream} "
              f"{(time.monotonic() - t0) * 1000:.1f}ms", file=sys.stderr, flush=True)
        if stream:
            if chat:
                last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}
            else:
                last = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish}
            await send({"id": rid, "object": obj, "created": created, "model": self.name, "choices": [last]})
            if include_usage:
                await send({"id": rid, "object": obj, "created": created, "model": self.name, "choices": [],
                            "usage": usage})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp

        text = "".join(text_parts)
        if chat:
            lp_obj = self._lp_obj(tokens, pieces, True, as_ids, 0) if logprobs is not None else None
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp_obj,
                      "finish_reason": finish}
            return web.json_response({"id": rid, "object": "chat.completion", "created": created,
                                      "model": self.name, "choices": [choice], "usage": usage})
        lp_obj = None
        if logprobs is not None:
            lp_obj = self._lp_obj(tokens, pieces, False, as_ids, len(prompt_text) if echo else 0)
            if echo_lp is not None:
                lp_obj = {k: echo_lp[k] + lp_obj[k] for k in echo_lp}
        choice = {"index": 0, "text": prompt_text + text, "logprobs": lp_obj, "finish_reason": finish}
        return web.json_response({"id": rid, "object": "text_completion", "created": created,
                                  "model": self.name, "choices": [choice], "usage": usage})

    def _legacy_prompt_logprobs(self, ids: list[int], chosen: list[float], top: list[list[tuple[int, float]]],
                                as_ids: bool) -> dict[str, list]:
        """OpenAI-legacy logprobs for echoed prompt tokens; position 0 has no context, hence null."""
        tokens = [self.tok_str(t, as_ids) for t in ids]
        offsets, pos = [], 0
        for t in ids:
            offsets.append(pos)
            pos += len(self.tok_str(t, False))
        top_lp: list[dict[str, float] | None] = [None]
        for i, cands in enumerate(top):
            d = {self.tok_str(t, as_ids): v for t, v in cands}
            # Like vLLM, the actual token is always present beside the top-K.
            d.setdefault(tokens[i + 1], chosen[i])
            top_lp.append(d)
        return {"tokens": tokens, "token_logprobs": [None] + chosen, "top_logprobs": top_lp,
                "text_offset": offsets}

    def _lp_obj(self, evs: list[TokenEvent], pieces: list[str], chat: bool, as_ids: bool,
                offset0: int) -> dict[str, Any]:
        """Logprobs of generated tokens in the chat or the legacy completions shape."""
        if chat:
            content = []
            for ev in evs:
                s = self.tok_str(ev.token_id, as_ids)
                content.append({"token": s, "logprob": ev.logprob, "bytes": list(s.encode()),
                                "top_logprobs": [{"token": self.tok_str(t, as_ids), "logprob": v,
                                                  "bytes": list(self.tok_str(t, as_ids).encode())}
                                                 for t, v in (ev.top or [])]})
            return {"content": content}
        tokens, tlp, top, offs, pos = [], [], [], [], offset0
        for ev, piece in zip(evs, pieces, strict=False):
            s = self.tok_str(ev.token_id, as_ids)
            tokens.append(s)
            tlp.append(ev.logprob)
            d = {self.tok_str(t, as_ids): v for t, v in (ev.top or [])}
            d.setdefault(s, ev.logprob)
            top.append(d)
            offs.append(pos)
            pos += len(piece)
        return {"tokens": tokens, "token_logprobs": tlp, "top_logprobs": top, "text_offset": offs}


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Turn stray exceptions into OpenAI-style error bodies instead of HTML pages."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise
    except BadRequest as exc:
        return _error(400, str(exc))


def build_app(engine: Engine, served_name: str) -> web.Application:
    """Create the aiohttp application serving ``engine`` under ``served_name``."""
    srv = Server(engine, served_name)
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.chat)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; defaults are the naive baseline."""
    ap = argparse.ArgumentParser(prog="hfserve", description="infergoal hfserve: OpenAI-compatible transformers server")
    ap.add_argument("--model", required=True, help="Hugging Face-format model directory")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", default=None, help="default: basename of --model")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--decode-loop", choices=["generate", "manual"], default="generate")
    _switch(ap, "--batching")
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--kv-cache", choices=["dynamic", "static"], default="dynamic")
    ap.add_argument("--attn", choices=["eager", "sdpa"], default=None,
                    help="attn_implementation passed to from_pretrained (default: transformers' choice)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--load", choices=["fast", "safetensors", "hf"], default="fast",
                    help="fast: safetensors straight onto the device by loading.py's threaded pread reader"
                         " (HFSERVE_LOAD_THREADS, HFSERVE_LOAD_CHUNK_MIB), safetensors' load_file where that"
                         " does not apply, from_pretrained where neither does; safetensors: the same with"
                         " load_file always; hf: transformers' from_pretrained always. Same weights every way.")
    add_fast_args(ap)
    args = ap.parse_args(argv)
    check_fast_args(args)
    return args


def _switch(ap: argparse.ArgumentParser, flag: str, help: str | None = None) -> None:
    """An option that is ``off`` (the default) or ``on``."""
    ap.add_argument(flag, choices=["off", "on"], default="off", help=help)


def add_fast_args(ap: argparse.ArgumentParser) -> None:
    """Device and fast-engine knobs (hfserve.fast)."""
    ap.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ...")
    ap.add_argument("--engine", choices=["hf", "fast"], default="hf",
                    help="hf: transformers generate()/manual loops above; fast: KV pool + continuous batching"
                         " (+ CUDA-graph decode), hfserve.fast")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="fast engine: prompt tokens prefilled per step between decode steps (0 = whole prompts)")
    ap.add_argument("--prefill-pack", type=int, default=0,
                    help="fast engine: queued whole prompts packed into one prefill forward pass, up to this many"
                         " tokens (0 = one prompt per forward pass)")
    ap.add_argument("--prefill-attn", choices=["torch", "fused", "fused-batched"], default="torch",
                    help="fast engine: prefill RoPE + KV store as one Triton kernel over all packed rows and SDPA"
                         " reading the KV pool in place (GQA, no repeated copy); fused-batched: fused, and a burst's"
                         " whole prompts of one length in consecutive slots attend in one SDPA call per 2**k of them;"
                         " torch: rotate-half and copies")
    ap.add_argument("--decode-attn", choices=["default", "lowp", "lowp-reg"], default="default",
                    help="fast engine with --kernels triton*: the Triton decode attention's dots; lowp: q and the"
                         " bf16 cache multiplied in bf16 MMA (not widened to tf32), with the launch tuned on the H200"
                         " (hfkernels.ATTN_LOWP): fewer bytes in registers, other rounding (the gates judge it);"
                         " lowp-reg: lowp, with an fp8 KV pool's tiles widened to bf16 in registers (not read back"
                         " from shared memory a byte at a time)")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto",
                    help="fast engine with --kernels triton*: the KV pool's dtype; fp8: float8 e4m3 with scale 1"
                         " (vLLM's --kv-cache-dtype fp8 without calibrated scales), half the bytes each decode step's"
                         " attention reads; values rounded (the gates judge it)")
    _switch(ap, "--overlap-schedule",
            help="fast engine: launch each greedy decode step from the last step's ids on the device"
                 " before the host reads them, so the host's per-step work (ids, events, streaming)"
                 " overlaps the device step (SGLang's overlap scheduler, vLLM's async scheduling)")
    ap.add_argument("--prefill-rounds", type=int, choices=[1, 2], default=1,
                    help="fast engine: prefill passes in a row before a decode step when prompts arrive during a"
                         " pass; 2: those prompts are prefilled at once (a burst decodes together, sooner),"
                         " 1: after one decode step of the rows there (arrivals spread out: lower TTFT)")
    _switch(ap, "--mm-glu",
            help="fast engine with --kernels triton-mm: at decode batch 2..64 the gate/up GEMM and SwiGLU in"
                 " one skinny-GEMM launch where hfkernels.MM_GLU_CONFIGS lists the shape (same rounding as"
                 " the two launches; the [batch, 2 x intermediate] tensor between them never written)")
    _switch(ap, "--mm-norm",
            help="fast engine with --kernels triton-mm: at decode batch 2..64 each RMSNorm folded into the"
                 " skinny GEMM after it (QKV, gate/up, lm_head: the norm's scale applied to the dot) and each"
                 " residual add into the GEMM before it (O, down), where hfkernels' launch tables list the shape:"
                 " no norm launch left; rounded once where the norm rounds twice (the accuracy gate judges it)")
    _switch(ap, "--gc-freeze",
            help="once the engine is built: collect, then gc.freeze() what start-up left (the model's, the"
                 " libraries' objects): the collector's later passes scan only what serving allocates, so a"
                 " full pass no longer holds the GIL for ~0.1-0.3 s in the middle of a burst (vLLM and SGLang"
                 " freeze the same way)")
    _switch(ap, "--pdl",
            help="fast engine with the Triton kernels, Hopper (sm_90+): launch the decode step's Triton"
                 " kernels with programmatic dependent launch: each is placed while the kernel before it"
                 " finishes and waits on it first (the GEMMs prefetch their first weight tiles into L2 meanwhile);"
                 " not at batch 1, where the H200's step ran slower with it")
    _switch(ap, "--cuda-graphs",
            help="fast engine: replay the decode step as CUDA graphs (GPU only)")
    ap.add_argument("--sdpa", choices=["auto", "flash", "efficient", "math"], default="auto",
                    help="fast engine: SDPA backend for prefill")
    ap.add_argument("--max-model-len", type=int, default=4608,
                    help="fast engine: longest prompt+output; sizes the preallocated KV pool")
    ap.add_argument("--kernels", choices=["torch", "triton", "triton-gemv", "triton-mv", "triton-mm"], default="torch",
                    help="fast engine with --cuda-graphs on: the decode step's norms, RoPE, attention and SwiGLU"
                         " (and prefill's norms and SwiGLU) as fused Triton kernels (hfserve.hfkernels); triton-gemv:"
                         " also the decode step's QKV and gate/up GEMVs (batch <= 16) with the norm fused before"
                         " and RoPE + KV store / SwiGLU after them; triton-mv: triton, and at decode batch 1 the"
                         " five projections (QKV, O, gate/up, down, lm_head) as plain Triton GEMVs; triton-mm:"
                         " triton-mv, and at batch 2..64 a skinny Triton GEMM where tuned for the shape (H200, 7B)")


def check_fast_args(args: argparse.Namespace) -> None:
    """Refuse flag combinations that would start a server slower than intended, in one line.

    ``--kernels triton`` needs the fast engine with CUDA graphs: launched eagerly, each Triton call
    costs ~25-60 us of host time (measured on the H200), more than the fused kernel saves, so the
    combination is refused rather than served slowly.
    """
    if args.kernels != "torch" and (args.engine != "fast" or args.cuda_graphs != "on"):
        raise SystemExit(f"hfserve: --kernels {args.kernels} needs --engine fast --cuda-graphs on "
                         "(launched eagerly, Triton kernels cost more than they save)")
    if args.kv_cache_dtype != "auto" and args.kernels == "torch":
        raise SystemExit(f"hfserve: --kv-cache-dtype {args.kv_cache_dtype} needs --kernels triton (or triton-gemv/-mv/-mm): "
                         "the Triton kernels store and read it")
    if args.mm_glu == "on" and args.kernels != "triton-mm":
        raise SystemExit(f"hfserve: --mm-glu on needs --kernels triton-mm, not {args.kernels}: it fuses that skinny GEMM's "
                         "gate/up launch with SwiGLU")
    if args.mm_norm == "on" and args.kernels != "triton-mm":
        raise SystemExit(f"hfserve: --mm-norm on needs --kernels triton-mm, not {args.kernels}: it folds the norms into"
                         " that skinny GEMM's launches")
    if args.pdl == "on" and args.kernels == "torch":
        raise SystemExit("hfserve: --pdl on needs --kernels triton (or triton-gemv/-mv/-mm): it launches those kernels")
    if args.decode_attn != "default" and args.kernels == "torch":
        raise SystemExit(f"hfserve: --decode-attn {args.decode_attn} needs --kernels triton (or triton-gemv/-mv/-mm): "
                         "it picks the Triton decode attention's launch")


def make_engine(args: argparse.Namespace, phases: Phases | None = None) -> Any:
    """The engine ``args`` ask for: the transformers-loop :class:`Engine` or the fast engine; ``phases``
    records where its start-up goes."""
    phases = phases or Phases()
    if args.engine == "fast":
        from .fast import FastEngine

        phases.mark("import")
        return FastEngine(args.model, dtype=args.dtype, device=args.device,
                          max_batch_size=args.max_batch_size if args.batching == "on" else 1,
                          max_model_len=args.max_model_len, prefill_chunk=args.prefill_chunk,
                          cuda_graphs=args.cuda_graphs == "on", sdpa=args.sdpa, kernels=args.kernels,
                          load=args.load, prefill_pack=args.prefill_pack, prefill_attn=args.prefill_attn,
                          decode_attn=args.decode_attn, kv_cache_dtype=args.kv_cache_dtype,
                          overlap_schedule=args.overlap_schedule == "on", prefill_rounds=args.prefill_rounds,
                          mm_glu=args.mm_glu == "on", mm_norm=args.mm_norm == "on", pdl=args.pdl == "on",
                          phases=phases)
    return Engine(args.model, dtype=args.dtype, decode_loop=args.decode_loop, batching=args.batching,
                  max_batch_size=args.max_batch_size, kv_cache=args.kv_cache, attn=args.attn,
                  threads=args.threads, device=args.device, load=args.load, phases=phases)


def main(argv: list[str] | None = None) -> None:
    """Load the model, start the HTTP server, print the readiness line."""
    # The engine part of the start-up line, broken down (tokenizer, CUDA, weights, build, graphs...):
    # its spans add up to that part, argument parsing in "args", whatever the engine does not mark in "other".
    phases = Phases(start=_T_IMPORTED)
    args = parse_args(argv)
    phases.mark("args")
    engine = make_engine(args, phases)
    if args.gc_freeze == "on":
        gc.collect()
        gc.freeze()
        print(f"hfserve: --gc-freeze on: {gc.get_freeze_count()} objects frozen", file=sys.stderr, flush=True)
    phases.mark("other")
    t_engine = phases.end  # the last mark: the engine part ends here, as the start-up line counts it
    print(phases.line(), file=sys.stderr, flush=True)
    if args.batching == "on" and args.decode_loop == "generate":
        print("hfserve: --batching on uses the manual decode loop", file=sys.stderr, flush=True)
    if args.kv_cache == "static" and (args.decode_loop == "manual" or args.batching == "on"):
        print("hfserve: --kv-cache static only affects --decode-loop generate", file=sys.stderr, flush=True)
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    app = build_app(engine, name)

    print(f"hfserve: serving {name} from {args.model} on {args.host}:{args.port} knobs={vars(args)}",
          file=sys.stderr, flush=True)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        print(startup_line(t_engine, time.perf_counter()), file=sys.stderr, flush=True)
        # Printed only once the socket listens, so launchers can wait on this line.
        print(f"infergoal-hfserve ready pid={os.getpid()}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass

if __name__ == "__main__":
    main()
