"""hfserve: a small OpenAI-compatible server on Hugging Face transformers (aiohttp).

Its defaults are deliberately as naive as InferenceBench's transformers baseline: one
request at a time, ``model.generate()`` per request with a streamer, float32. The knobs
(``--decode-loop manual``, ``--batching on``, ``--dtype``, ``--attn``, ``--kv-cache``,
``--threads``) unlock real speed, so an optimizer has something honest to find.

Usage::

    python examples/hfserve/server.py --model DIR --port 8000 [--host 127.0.0.1]
        [--served-model-name NAME] [--dtype float32|bfloat16|float16]
        [--decode-loop generate|manual] [--batching off|on] [--max-batch-size 8]
        [--kv-cache dynamic|static] [--attn eager|sdpa] [--threads N]

All model work happens on one worker thread fed by a job queue (that queue *is* the
global lock of the baseline); the aiohttp event loop only parses, detokenizes and
streams, so slow clients never stall the model.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import inspect
import json
import math
import os
import queue
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from aiohttp import web

# --------------------------------------------------------------------------- requests


class BadRequest(Exception):
    """A client error, answered with HTTP 400 and an OpenAI-style error body."""


@dataclass
class TokenEvent:
    """One generated token, with its logprob data when the request asked for it."""

    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


@dataclass
class GenRequest:
    """A generation job handed from the event loop to the model worker."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    ignore_eos: bool
    logprobs: int | None  # top-K per generated token, None = no logprobs
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    finish_reason: str | None = None
    n_generated: int = 0

    def emit(self, kind: str, payload: Any) -> None:
        """Thread-safe: queue an event for the request's handler on the event loop."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


@dataclass
class ScoreRequest:
    """A teacher-forced scoring job: log-probabilities of every prompt token."""

    prompt_ids: list[int]
    top_k: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


# --------------------------------------------------------------------------- engine


def _sample_row(logits: torch.Tensor, req: GenRequest, gen: torch.Generator | None) -> int:
    """Pick the next token for one sequence from its float32 logits row."""
    if req.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / req.temperature, dim=-1)
    if req.top_p < 1.0:
        # Nucleus: keep the smallest prefix of sorted tokens whose mass reaches top_p.
        sp, si = torch.sort(probs, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        sp[(cum - sp) > req.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, si, sp)
    return int(torch.multinomial(probs, 1, generator=gen))


def _token_event(token: int, logits: torch.Tensor, k: int | None) -> TokenEvent:
    """Build the event for ``token``; logprobs come from the raw (untempered) logits like vLLM."""
    if k is None:
        return TokenEvent(token)
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if k > 0:
        vals, idx = torch.topk(lp, min(k, lp.shape[-1]))
        top = list(zip(idx.tolist(), vals.tolist(), strict=False))
    return TokenEvent(token, float(lp[token]), top)


class _Seq:
    """Per-sequence state inside the batched decode loop."""

    __slots__ = ("req", "gen", "last", "cache_len")

    def __init__(self, req: GenRequest, gen: torch.Generator | None, last: int, cache_len: int) -> None:
        self.req, self.gen, self.last, self.cache_len = req, gen, last, cache_len


def _leftpad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """Prepend ``n`` zeros along ``dim`` (KV rows and mask columns of shorter sequences)."""
    if n <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class Engine:
    """Owns the model and runs every forward pass on one worker thread."""

    def __init__(self, model_dir: str, *, dtype: str = "float32", decode_loop: str = "generate",
                 batching: str = "off", max_batch_size: int = 8, kv_cache: str = "dynamic",
                 attn: str | None = None, threads: int | None = None, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.threads = threads
        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
        if attn:
            kwargs["attn_implementation"] = attn
        self.device = torch.device(device)
        if self.device.type != "cpu":
            kwargs["device_map"] = device  # load straight onto the GPU, no host copy
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs).eval()
        cfg = self.model.config
        self.max_len = int(getattr(cfg, "max_position_embeddings", 2048))
        self.eos_ids = set(self._as_list(self.model.generation_config.eos_token_id or cfg.eos_token_id))
        self.decode_loop = decode_loop
        self.batching = batching == "on"
        # Batching needs our own step loop (generate() cannot admit requests mid-flight).
        self.max_batch = max(1, max_batch_size) if self.batching else 1
        self.kv_cache = kv_cache
        # transformers renamed `past_key_values` to `cache` (5.2x); support both.
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="hfserve-worker", daemon=True)
        self.thread.start()

    @staticmethod
    def _as_list(x: Any) -> list[int]:
        if x is None:
            return []
        return list(x) if isinstance(x, (list, tuple)) else [int(x)]

    def submit(self, job: GenRequest | ScoreRequest) -> None:
        """Queue a job for the worker thread."""
        self.jobs.put(job)

    # -- worker side ---------------------------------------------------------------

    def _forward(self, ids: torch.Tensor, cache: Any = None, **kw: Any) -> tuple[torch.Tensor, Any]:
        kw[self.cache_kw] = cache
        out = self.model(input_ids=ids, use_cache=True, **kw)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        return out.logits, new_cache

    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)  # OpenMP settings are per thread
        with torch.inference_mode():
            if self.decode_loop == "generate" and not self.batching:
                while True:
                    job = self.jobs.get()
                    self._safe(self._generate_hf if isinstance(job, GenRequest) else self._score, job)
            else:
                self._step_loop()

    def _safe(self, fn: Any, job: GenRequest | ScoreRequest) -> None:
        try:
            fn(job)
        except Exception as exc:  # report to the client instead of killing the worker
            print(f"hfserve: job failed: {exc!r}", file=sys.stderr, flush=True)
            if isinstance(job, GenRequest):
                job.emit("error", str(exc))
            else:
                job.loop.call_soon_threadsafe(job.future.set_exception, exc)

    def _score(self, job: ScoreRequest) -> None:
        """Teacher-forced log-probabilities of the prompt: one forward pass, no cache."""
        ids = torch.tensor([job.prompt_ids], device=self.device)
        logits = self.model(input_ids=ids, use_cache=False).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        chosen = lp[:-1].gather(-1, ids[0, 1:, None])[:, 0].tolist()
        top: list[list[tuple[int, float]]] = []
        if job.top_k > 0:
            vals, idx = torch.topk(lp[:-1], min(job.top_k, lp.shape[-1]), dim=-1)
            top = [list(zip(i, v, strict=False)) for i, v in zip(idx.tolist(), vals.tolist(), strict=False)]
        else:
            top = [[] for _ in chosen]
        job.loop.call_soon_threadsafe(job.future.set_result, (chosen, top))

    def _generate_hf(self, req: GenRequest) -> None:
        """Baseline path: ``model.generate()`` with a streamer, like InferenceBench's server."""
        from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        captured: list[torch.Tensor] = []
        eos_ids = self.eos_ids

        class Capture(LogitsProcessor):
            # Merged before the temperature/top-p warpers, so it sees raw logits (vLLM's convention).
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                captured.append(scores[0].float().clone())
                return scores

        class Streamer(BaseStreamer):
            def __init__(self) -> None:
                self.first = True

            def put(self, value: torch.Tensor) -> None:
                if self.first:  # generate() first feeds the prompt back
                    self.first = False
                    return
                for tok in value.reshape(-1).tolist():
                    logits = captured[-1] if captured else None
                    ev = _token_event(tok, logits, req.logprobs) if logits is not None else TokenEvent(tok)
                    req.n_generated += 1
                    req.emit("token", ev)
                    if tok in eos_ids and not req.ignore_eos:
                        req.finish_reason = "stop"

            def end(self) -> None:
                pass

        class Cancel(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
                return torch.full((input_ids.shape[0],), req.cancelled, dtype=torch.bool, device=input_ids.device)

        gc = copy.deepcopy(self.model.generation_config)
        gc.max_new_tokens = req.max_tokens
        gc.min_new_tokens = None
        gc.do_sample = req.temperature > 0
        gc.temperature = req.temperature if req.temperature > 0 else 1.0
        gc.top_p = req.top_p
        gc.top_k = None
        if req.ignore_eos:
            gc.eos_token_id = None
        if self.kv_cache == "static":
            gc.cache_implementation = "static"
        if req.seed is not None:
            torch.manual_seed(req.seed)
        ids = torch.tensor([req.prompt_ids], device=self.device)
        self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=gc,
            streamer=Streamer(),
            logits_processor=LogitsProcessorList([Capture()]) if req.logprobs is not None else None,
            stopping_criteria=StoppingCriteriaList([Cancel()]),
        )
        req.emit("done", req.finish_reason or "length")

    def _step_loop(self) -> None:
        """Manual prefill + decode with a KV cache; with batching on, continuous batching.

        Requests join the running batch between decode steps (prefilled alone, their KV
        left-padded to the batch length) and leave as soon as they finish, so a long
        request never holds short ones hostage.
        """
        seqs: list[_Seq] = []
        pending: deque[GenRequest] = deque()
        cache: Any = None
        mask: torch.Tensor | None = None
        while True:
            block = not seqs and not pending
            while True:
                try:
                    job = self.jobs.get(block=block)
                except queue.Empty:
                    break
                block = False
                if isinstance(job, ScoreRequest):
                    self._safe(self._score, job)
                else:
                    pending.append(job)
            while pending and len(seqs) < self.max_batch:
                req = pending.popleft()
                if req.cancelled:
                    continue
                try:
                    admitted = self._prefill(req)
                except Exception as exc:
                    print(f"hfserve: prefill failed: {exc!r}", file=sys.stderr, flush=True)
                    req.emit("error", str(exc))
                    continue
                if admitted is None:
                    continue
                seq, new_cache = admitted
                cache, mask = self._merge(cache, mask, new_cache, seq.cache_len)
                seqs.append(seq)
            if not seqs:
                continue
            try:
                keep = self._decode_step(seqs, cache, mask)
                mask = torch.cat([mask, mask.new_ones(len(seqs), 1)], dim=1)
            except Exception as exc:
                print(f"hfserve: decode failed: {exc!r}", file=sys.stderr, flush=True)
                for s in seqs:
                    s.req.emit("error", str(exc))
                seqs, cache, mask = [], None, None
                continue
            if len(keep) < len(seqs):
                seqs = [seqs[i] for i in keep]
                if not seqs:
                    cache, mask = None, None
                else:
                    cache, mask = self._select(cache, mask, keep)

    def _finish_check(self, seq: _Seq, tok: int) -> bool:
        req = seq.req
        if tok in self.eos_ids and not req.ignore_eos:
            req.emit("done", "stop")
            return True
        if req.n_generated >= req.max_tokens:
            req.emit("done", "length")
            return True
        return False

    def _prefill(self, req: GenRequest) -> tuple[_Seq, Any] | None:
        gen = None
        if req.temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(req.seed if req.seed is not None else int.from_bytes(os.urandom(4), "little"))
        ids = torch.tensor([req.prompt_ids], device=self.device)
        # Only the last position's logits are needed: skip the LM head on the rest of the prompt.
        logits, new_cache = self._forward(ids, logits_to_keep=1)
        row = logits[0, -1].float()
        tok = _sample_row(row, req, gen)
        req.n_generated += 1
        req.emit("token", _token_event(tok, row, req.logprobs))
        seq = _Seq(req, gen, tok, len(req.prompt_ids))
        if self._finish_check(seq, tok):
            return None
        return seq, new_cache

    @staticmethod
    def _merge(cache: Any, mask: torch.Tensor | None, new: Any, new_len: int) -> tuple[Any, torch.Tensor]:
        """Append a freshly prefilled sequence's KV to the batch cache, left-padding the shorter side."""
        new_mask = torch.ones(1, new_len, dtype=torch.long, device=new.layers[0].keys.device)
        if cache is None:
            return new, new_mask
        old_len = mask.shape[1]
        length = max(old_len, new_len)
        for lb, ln in zip(cache.layers, new.layers, strict=False):
            lb.keys = torch.cat([_leftpad(lb.keys, length - old_len, -2), _leftpad(ln.keys, length - new_len, -2)])
            lb.values = torch.cat(
                [_leftpad(lb.values, length - old_len, -2), _leftpad(ln.values, length - new_len, -2)]
            )
        mask = torch.cat([_leftpad(mask, length - old_len, 1), _leftpad(new_mask, length - new_len, 1)])
        return cache, mask

    @staticmethod
    def _select(cache: Any, mask: torch.Tensor, keep: list[int]) -> tuple[Any, torch.Tensor]:
        """Drop finished rows, then trim columns that are padding in every remaining row."""
        idx = torch.tensor(keep, device=mask.device)
        mask = mask.index_select(0, idx)
        first = int(mask.any(dim=0).long().argmax())
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[..., first:, :]
            layer.values = layer.values.index_select(0, idx)[..., first:, :]
        return cache, mask[:, first:]

    def _decode_step(self, seqs: list[_Seq], cache: Any, mask: torch.Tensor) -> list[int]:
        """One decode step for every active sequence; returns the indices that continue."""
        inp = torch.tensor([[s.last] for s in seqs], device=self.device)
        pos = torch.tensor([[s.cache_len] for s in seqs], device=self.device)
        # Without padding (a lone sequence) no mask is needed; skipping it avoids building a 4D mask per step.
        step_mask = None if len(seqs) == 1 and bool(mask.all()) else torch.cat(
            [mask, mask.new_ones(len(seqs), 1)], dim=1)
        logits, _ = self._forward(inp, cache, attention_mask=step_mask, position_ids=pos)
        logits = logits[:, -1].float()
        greedy = torch.argmax(logits, dim=-1).tolist()
        keep: list[int] = []
        for i, s in enumerate(seqs):
            s.cache_len += 1
            req = s.req
            if req.cancelled:
                continue
            tok = greedy[i] if req.temperature <= 0 else _sample_row(logits[i], req, s.gen)
            req.n_generated += 1
            req.emit("token", _token_event(tok, logits[i], req.logprobs))
            s.last = tok
            if not self._finish_check(s, tok):
                keep.append(i)
        return keep


# --------------------------------------------------------------------------- HTTP layer


class Detok:
    """Incremental detokenizer (the prefix/read-offset scheme of TGI/vLLM).

    Decoding only a short window per token keeps streaming O(1) per token and never
    emits half of a multi-byte character.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def add(self, token_id: int) -> str:
        """Add one token and return the newly completed text (possibly empty)."""
        self.ids.append(token_id)
        prefix_text = self.tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        new_text = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""


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
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.engine.model.config.vocab_size
            if any(t < 0 or t >= vocab for t in prompt):
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
            await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

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
            while req is not None:
                kind, payload = await req.events.get()
                if kind == "error":
                    raise RuntimeError(payload)
                if kind == "done":
                    finish = payload
                    break
                ev: TokenEvent = payload
                piece = detok.add(ev.token_id)
                tokens.append(ev)
                pieces.append(piece)
                text_parts.append(piece)
                if stream:
                    lp_obj = self._lp_obj([ev], [piece], chat, as_ids, 0) if logprobs is not None else None
                    if chat:
                        choice = {"index": 0, "delta": {"content": piece}, "logprobs": lp_obj, "finish_reason": None}
                    else:
                        choice = {"index": 0, "text": piece, "logprobs": lp_obj, "finish_reason": None}
                    await send({"id": rid, "object": obj, "created": created, "model": self.name,
                                "choices": [choice]})
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
    ap = argparse.ArgumentParser(description="infergoal hfserve: OpenAI-compatible transformers server")
    ap.add_argument("--model", required=True, help="Hugging Face-format model directory")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", default=None, help="default: basename of --model")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--decode-loop", choices=["generate", "manual"], default="generate")
    ap.add_argument("--batching", choices=["off", "on"], default="off")
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--kv-cache", choices=["dynamic", "static"], default="dynamic")
    ap.add_argument("--attn", choices=["eager", "sdpa"], default=None,
                    help="attn_implementation passed to from_pretrained (default: transformers' choice)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    add_fast_args(ap)
    return ap.parse_args(argv)


def add_fast_args(ap: argparse.ArgumentParser) -> None:
    """Device and fast-engine knobs (examples/hfserve/fastengine.py)."""
    ap.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ...")
    ap.add_argument("--engine", choices=["hf", "fast"], default="hf",
                    help="hf: transformers generate()/manual loops above; fast: KV pool + continuous batching"
                         " (+ CUDA-graph decode), fastengine.py")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="fast engine: prompt tokens prefilled per step between decode steps (0 = whole prompts)")
    ap.add_argument("--cuda-graphs", choices=["off", "on"], default="off",
                    help="fast engine: replay the decode step as CUDA graphs (GPU only)")
    ap.add_argument("--sdpa", choices=["auto", "flash", "efficient", "math"], default="auto",
                    help="fast engine: SDPA backend for prefill")
    ap.add_argument("--max-model-len", type=int, default=4608,
                    help="fast engine: longest prompt+output; sizes the preallocated KV pool")


def make_engine(args: argparse.Namespace) -> Any:
    """The engine ``args`` ask for: the transformers-loop :class:`Engine` or the fast engine."""
    if args.engine == "fast":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from fastengine import FastEngine

        return FastEngine(args.model, dtype=args.dtype, device=args.device,
                          max_batch_size=args.max_batch_size if args.batching == "on" else 1,
                          max_model_len=args.max_model_len, prefill_chunk=args.prefill_chunk,
                          cuda_graphs=args.cuda_graphs == "on", sdpa=args.sdpa, sample_row=_sample_row,
                          token_event=_token_event, score_type=ScoreRequest)
    return Engine(args.model, dtype=args.dtype, decode_loop=args.decode_loop, batching=args.batching,
                  max_batch_size=args.max_batch_size, kv_cache=args.kv_cache, attn=args.attn,
                  threads=args.threads, device=args.device)


def main(argv: list[str] | None = None) -> None:
    """Load the model, start the HTTP server, print the readiness line."""
    args = parse_args(argv)
    engine = make_engine(args)
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
