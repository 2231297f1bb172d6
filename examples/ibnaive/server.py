"""ibnaive: InferenceBench's naive transformers server, as a second baseline for the GPU benchmark.

The semantics of InferenceBench's ``src/eval/inference/servers/transformers_openai_server.py``
(aisa-group/InferenceBench), rewritten here (no code copied):
* every request runs ``model.generate()`` in a background thread with a ``TextIteratorStreamer``
  (``skip_prompt``, ``skip_special_tokens``), and the HTTP handler streams what the streamer
  yields: text at the streamer's word boundaries (it holds text back until a space, a newline or
  a CJK character), so one SSE chunk may carry several tokens; empty pieces send nothing;
* the prompt is the tokenizer's chat template (or ``role: content`` lines without one), truncated
  from the left to ``max_model_len - max_tokens - 1``; ``max_tokens`` defaults to 256 and
  ``temperature`` to 0 (greedy); the final chunk carries ``finish_reason`` and ``usage``.

Where it differs, and why (each is the minimum our bench, ``orchestrator/bench``, needs to measure it):
* bf16 by default (IB's default is fp16; the forged 7B overflows fp16);
* one request at a time (``--lock on``, the default): IB's server takes no lock, each request
  starts its own ``generate()`` thread and concurrent ones interleave on the GPU; ``--lock off``
  does that;
* ``usage.completion_tokens`` counts generated tokens (IB's counts non-empty chunks, i.e. words,
  and IB's runner divides decode time by it, so its TPOT is per word); ``--usage-count chunks``
  gives IB's count. ``prompt_tokens``/``total_tokens`` are added;
* ``/v1/completions`` (IB serves chat only), ``ignore_eos`` (generate without an EOS id, so
  lengths are pinned), and, when a request asks for ``logprobs``, the ids of the tokens inside
  each chunk (``return_tokens_as_token_ids``: ``token_id:N``) with their log-probabilities, so
  the client counts tokens exactly; ``/health``.

Usage::

    python examples/ibnaive/server.py --model DIR --port 8000 [--device cuda] [--dtype bfloat16]
        [--served-model-name NAME] [--lock on|off] [--usage-count tokens|chunks] [--max-model-len N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

import torch
from aiohttp import web
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)


class ChunkStreamer(TextIteratorStreamer):
    """IB's streamer, also remembering which token ids each text piece came from.

    Pieces go straight to an asyncio queue (IB pumps them there through a second thread).
    Each item is ``(text, ids, logprobs)``; ``None`` ends the stream.
    """

    def __init__(self, tokenizer: Any, loop: asyncio.AbstractEventLoop, out: asyncio.Queue,
                 logits: list[torch.Tensor] | None) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.loop, self.out, self.logits = loop, out, logits
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.n_tokens = 0

    def put(self, value: torch.Tensor) -> None:
        if self.skip_prompt and self.next_tokens_are_prompt:
            super().put(value)  # generate() feeds the prompt back first; the parent drops it
            return
        toks = value.reshape(-1).tolist()
        for t in toks:
            if self.logits is not None and self.logits:
                row = self.logits.pop()
                self.lps.append(float(row[t] - torch.logsumexp(row, dim=-1)))
        self.ids += toks
        self.n_tokens += len(toks)
        super().put(value)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        ids, lps = self.ids, self.lps
        self.ids, self.lps = [], []
        self.loop.call_soon_threadsafe(self.out.put_nowait, (text, ids, lps))
        if stream_end:
            self.loop.call_soon_threadsafe(self.out.put_nowait, None)


class _Capture(LogitsProcessor):
    """Keeps the raw logits of the step (before any warper), for the chosen token's logprob."""

    def __init__(self, sink: list[torch.Tensor]) -> None:
        self.sink = sink

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.sink.append(scores[0].float())
        return scores


class _Cancel(StoppingCriteria):
    """Stops generate() once the client has gone (IB lets it run on)."""

    def __init__(self) -> None:
        self.cancelled = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.cancelled, dtype=torch.bool, device=input_ids.device)


class BadRequest(Exception):
    """Answered with HTTP 400."""


class IBNaive:
    """The model, the tokenizer and the request handlers."""

    def __init__(self, model_dir: str, *, dtype: str = "bfloat16", device: str = "cpu", name: str = "",
                 lock: bool = True, usage_count: str = "tokens", max_model_len: int = 0) -> None:
        self.tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
        kw: dict[str, Any] = {"dtype": getattr(torch, dtype)}
        if device != "cpu":
            kw["device_map"] = device
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, **kw).eval()
        self.device = torch.device(device)
        self.name = name or os.path.basename(os.path.normpath(model_dir))
        cfg_len = getattr(self.model.config, "max_position_embeddings", None)
        self.max_len = max_model_len if max_model_len > 0 else (cfg_len if isinstance(cfg_len, int) else None)
        self.lock = asyncio.Lock() if lock else None
        self.usage_count = usage_count
        self.busy = 0  # generate() threads running now (tests read it through /health)
        self.peak_busy = 0

    # -- prompts -------------------------------------------------------------------

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages
                if isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)]
        if not msgs:
            raise BadRequest("missing messages")
        if getattr(self.tok, "chat_template", None):
            try:
                out = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
                return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
            except Exception:
                pass
        joined = "\n".join(f"{m['role']}: {m['content']}" for m in msgs)
        return list(self.tok(joined)["input_ids"])

    def prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return list(self.tok(prompt)["input_ids"])
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if any(t < 0 or t >= self.model.config.vocab_size for t in prompt):
                raise BadRequest("prompt token id out of range")
            return list(prompt)
        raise BadRequest("prompt must be a non-empty string or a list of token ids")

    def truncate(self, ids: list[int], max_new: int) -> list[int]:
        """IB's rule: keep the last ``max_model_len - max_new_tokens - 1`` prompt tokens."""
        if self.max_len is not None:
            room = max(0, int(self.max_len) - int(max_new) - 1)
            if room > 0 and len(ids) > room:
                ids = ids[-room:]
        return ids

    # -- generation ----------------------------------------------------------------

    def start(self, ids: list[int], max_new: int, temperature: float, ignore_eos: bool, logprobs: bool,
              loop: asyncio.AbstractEventLoop) -> tuple[ChunkStreamer, asyncio.Queue, threading.Thread, _Cancel]:
        """IB's ``_start_generation``: generate() in a thread, its streamer feeding ``queue``."""
        out: asyncio.Queue = asyncio.Queue()
        sink: list[torch.Tensor] | None = [] if logprobs else None
        streamer = ChunkStreamer(self.tok, loop, out, sink)
        cancel = _Cancel()
        input_ids = torch.tensor([ids], device=self.device)
        # IB passes these as generate() kwargs; here on a copy of the model's generation config.
        gc = self.model.generation_config.__class__.from_dict(self.model.generation_config.to_dict())
        gc.max_new_tokens = int(max_new)
        gc.do_sample = temperature > 0.0
        gc.pad_token_id = self.tok.eos_token_id
        if gc.do_sample:
            gc.temperature = float(temperature)
        if ignore_eos:  # no EOS id: generate() stops only at max_new_tokens
            gc.eos_token_id = None
        kw: dict[str, Any] = {
            "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "generation_config": gc,
            "streamer": streamer, "stopping_criteria": StoppingCriteriaList([cancel]),
        }
        if sink is not None:
            kw["logits_processor"] = LogitsProcessorList([_Capture(sink)])

        def run() -> None:
            self.busy += 1
            self.peak_busy = max(self.peak_busy, self.busy)
            try:
                with torch.inference_mode():
                    self.model.generate(**kw)
            except Exception as exc:  # the streamer has no error channel: log it and end the stream
                print(f"ibnaive: generate() raised {exc!r}", file=sys.stderr, flush=True)
                loop.call_soon_threadsafe(out.put_nowait, None)
            finally:
                self.busy -= 1

        thread = threading.Thread(target=run, name="ibnaive-generate", daemon=True)
        thread.start()
        return streamer, out, thread, cancel

    # -- HTTP ------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "busy": self.busy, "peak_busy": self.peak_busy})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model",
                                                             "max_model_len": self.max_len}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def _handle(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            default_max = 256 if chat else 16
            max_new = int(body.get("max_completion_tokens", body.get("max_tokens", body.get("max_new_tokens", default_max))))
            if max_new < 1:
                raise BadRequest("max_tokens must be >= 1")
            ids = self.chat_ids(body.get("messages") or []) if chat else self.prompt_ids(body.get("prompt"))
            ids = self.truncate(ids, max_new)
            temperature = float(body.get("temperature", 0.0) or 0.0)
        except (BadRequest, ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc), "type": "invalid_request_error"}}, status=400)
        if self.lock is None:
            return await self._generate(request, body, ids, max_new, temperature, chat=chat)
        async with self.lock:  # one request at a time: the rest wait here, in arrival order
            return await self._generate(request, body, ids, max_new, temperature, chat=chat)

    async def _generate(self, request: web.Request, body: dict, ids: list[int], max_new: int,
                        temperature: float, *, chat: bool) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        lp = body.get("logprobs")
        want_lp = lp is not None and lp is not False  # completions ask with logprobs=0
        as_ids = bool(body.get("return_tokens_as_token_ids", False))
        streamer, queue, thread, cancel = self.start(ids, max_new, temperature, bool(body.get("ignore_eos")),
                                                     want_lp, loop)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        stream = bool(body.get("stream", chat))  # IB: chat streams unless told otherwise
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)

        def tokstr(t: int) -> str:
            return f"token_id:{t}" if as_ids else self.tok.decode([t])

        def lp_obj(toks: list[int], lps: list[float], offset: int) -> dict[str, Any] | None:
            if not want_lp:
                return None
            lps = lps + [0.0] * (len(toks) - len(lps))
            if chat:
                return {"content": [{"token": tokstr(t), "logprob": v, "bytes": list(tokstr(t).encode()),
                                     "top_logprobs": []} for t, v in zip(toks, lps, strict=True)]}
            names = [tokstr(t) for t in toks]
            return {"tokens": names, "token_logprobs": lps,
                    "top_logprobs": [{n: v} for n, v in zip(names, lps, strict=True)],
                    "text_offset": [offset] * len(toks)}

        def choice(text: str, toks: list[int], lps: list[float], offset: int, finish: str | None) -> dict:
            c: dict[str, Any] = {"index": 0, "logprobs": lp_obj(toks, lps, offset), "finish_reason": finish}
            if chat:
                c["delta"] = {"content": text} if text or finish is None else {}
            else:
                c["text"] = text
            return c

        parts: list[str] = []
        all_ids: list[int] = []
        all_lps: list[float] = []
        chunks = 0
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                text, toks, lps = item
                all_ids += toks
                all_lps += lps
                if not text and not (want_lp and toks):
                    continue  # IB sends nothing for an empty piece (ours: unless it carries token ids)
                offset = sum(len(p) for p in parts)
                parts.append(text)
                chunks += 1 if text else 0
                if stream:
                    await resp.write(b"data: " + json.dumps({
                        "id": rid, "object": obj, "created": created, "model": self.name,
                        "choices": [choice(text, toks, lps, offset, None)]}).encode() + b"\n\n")
            await asyncio.to_thread(thread.join)
        except (ConnectionResetError, asyncio.CancelledError):
            cancel.cancelled = True
            await asyncio.to_thread(thread.join)  # the lock is held until generate() has stopped
            raise
        n = streamer.n_tokens
        finish = "length" if n >= max_new else "stop"
        done = n if self.usage_count == "tokens" else chunks
        usage = {"prompt_tokens": len(ids), "completion_tokens": done, "total_tokens": len(ids) + done}
        if stream:
            await resp.write(b"data: " + json.dumps({
                "id": rid, "object": obj, "created": created, "model": self.name,
                "choices": [choice("", [], [], 0, finish)], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        text = "".join(parts)
        if chat:
            c = {"index": 0, "message": {"role": "assistant", "content": text},
                 "logprobs": lp_obj(all_ids, all_lps, 0), "finish_reason": finish}
        else:
            c = {"index": 0, "text": text, "logprobs": lp_obj(all_ids, all_lps, 0), "finish_reason": finish}
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": created, "model": self.name, "choices": [c], "usage": usage})


def build_app(srv: IBNaive) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_post("/v1/chat/completions", srv.chat)
    app.router.add_post("/v1/completions", srv.completions)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="InferenceBench's naive transformers server (bf16, one request at a time)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8001")))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", default=None, help="default: basename of --model")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lock", choices=["on", "off"], default="on",
                    help="on: one request at a time; off: IB's own behaviour, a generate() thread per request")
    ap.add_argument("--usage-count", choices=["tokens", "chunks"], default="tokens",
                    help="usage.completion_tokens: generated tokens, or IB's count of non-empty chunks")
    ap.add_argument("--max-model-len", type=int, default=0, help="0: the config's max_position_embeddings")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    srv = IBNaive(args.model, dtype=args.dtype, device=args.device, name=args.served_model_name or "",
                  lock=args.lock == "on", usage_count=args.usage_count, max_model_len=args.max_model_len)
    app = build_app(srv)
    print(f"ibnaive: serving {srv.name} from {args.model} on {args.host}:{args.port} knobs={vars(args)}",
          file=sys.stderr, flush=True)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        print(f"infergoal-ibnaive ready pid={os.getpid()}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
