"""hfserve's engine: model loading, generation, batching, teacher-forced scoring (no HTTP).

:class:`Engine` owns a transformers model and runs every forward pass on one worker thread fed by a
job queue (that queue *is* the global lock of the baseline): ``model.generate()`` per request with
a streamer (the default), or an own prefill + decode loop over a ``DynamicCache``, with continuous
batching when asked. The HTTP layer (server.py) hands it :class:`GenRequest` and
:class:`ScoreRequest` jobs and reads events back on its event loop.

The fast engine (hfserve.fast) shares this module's job types, sampling, finish check and
prompt scoring, so both engines stop and score by the same rule.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .loading import (
    Phases,
    init_device,
    load_model,
)

__all__ = [
    "Engine",
    "EventStream",
    "GenRequest",
    "ScoreRequest",
    "TokenEvent",
    "as_list",
    "drain_jobs",
    "finish_check",
    "prompt_logprobs",
    "request_generator",
    "sample_row",
    "token_event",
    "wake",
]

# --------------------------------------------------------------------------- jobs


@dataclass
class TokenEvent:
    """One generated token, with its logprob data when the request asked for it."""

    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


class EventStream:
    """A request's events, from the worker thread to its handler on the event loop.

    The worker appends with :meth:`push` (a deque append: no lock, no syscall) and wakes the
    handler with :func:`wake`, once per decode step for the whole batch rather than once per token
    per request. The handler reads one event with :meth:`get` or everything queued with
    :meth:`get_batch`. A token's payload may be a bare id (the fast engine's, when no logprobs
    were asked); :meth:`get` hands it out as a :class:`TokenEvent` either way.
    """

    __slots__ = ("_buf", "_waiter")

    def __init__(self) -> None:
        self._buf: deque = deque()
        self._waiter: asyncio.Future | None = None

    def push(self, kind: str, payload: Any) -> None:
        """Worker side: queue an event; the handler sees it after the next :func:`wake`."""
        self._buf.append((kind, payload))

    def _wake(self) -> None:  # on the event loop
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        while not self._buf:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def get(self) -> tuple[str, Any]:
        """The next event, ``(kind, payload)``; a token's payload is a :class:`TokenEvent`."""
        await self._wait()
        kind, payload = self._buf.popleft()
        if kind == "token" and isinstance(payload, int):
            payload = TokenEvent(payload)
        return kind, payload

    async def get_batch(self) -> list[tuple[str, Any]]:
        """Every queued event (at least one), in order; a token's payload is an id or a :class:`TokenEvent`."""
        await self._wait()
        buf = self._buf
        return [buf.popleft() for _ in range(len(buf))]


def _wake_all(streams: list[EventStream]) -> None:
    for s in streams:
        s._wake()


def wake(reqs: list[GenRequest]) -> None:
    """Thread-safe: wake the handlers of ``reqs`` after :meth:`GenRequest.push`, one event-loop call
    per loop (every request of a server shares one) instead of one per request."""
    by_loop: dict[Any, list[EventStream]] = {}
    for r in reqs:
        by_loop.setdefault(r.loop, []).append(r.events)
    for loop, streams in by_loop.items():
        try:
            loop.call_soon_threadsafe(_wake_all, streams)
        except RuntimeError:  # the loop was closed (the server is shutting down)
            pass


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
    events: EventStream = field(default_factory=EventStream)
    cancelled: bool = False
    finish_reason: str | None = None
    n_generated: int = 0

    def emit(self, kind: str, payload: Any) -> None:
        """Thread-safe: queue an event for the request's handler on the event loop and wake it."""
        self.events.push(kind, payload)
        self.loop.call_soon_threadsafe(self.events._wake)

    def push(self, kind: str, payload: Any) -> None:
        """Thread-safe: queue an event without waking the handler (the worker calls :func:`wake`)."""
        self.events.push(kind, payload)


@dataclass
class ScoreRequest:
    """A teacher-forced scoring job: log-probabilities of every prompt token."""

    prompt_ids: list[int]
    top_k: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


# --------------------------------------------------------------------------- shared by both engines


def as_list(x: Any) -> list[int]:
    """A config's ``eos_token_id`` (None, one id or a list) as a list."""
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [int(x)]


def sample_row(logits: torch.Tensor, req: GenRequest, gen: torch.Generator | None) -> int:
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


def token_event(token: int, logits: torch.Tensor, k: int | None) -> TokenEvent:
    """Build the event for ``token``; logprobs come from the raw (untempered) logits like vLLM."""
    if k is None:
        return TokenEvent(token)
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if k > 0:
        vals, idx = torch.topk(lp, min(k, lp.shape[-1]))
        top = list(zip(idx.tolist(), vals.tolist(), strict=False))
    return TokenEvent(token, float(lp[token]), top)


def logprob_table(logits: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`token_event`'s numbers for a whole batch, on the device, to come back in one copy.

    ``logits`` [n, V] (raw), ``ids`` [n] the chosen tokens; returns float64 [n, 2 + 2k]: each row is
    (token id, its logprob, the top ``k`` logprobs, their ids). The log-softmax is token_event's (the
    same op over each row: the same values), ids are exact in float64. Built once per decode step
    instead of a log-softmax and a device->host read per row (64 of each per step at batch 64)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    cols = [ids[:, None].double(), lp.gather(1, ids[:, None].long()).double()]
    if k > 0:
        vals, idx = torch.topk(lp, min(k, lp.shape[-1]))
        cols += [vals.double(), idx.double()]
    return torch.cat(cols, 1)


def table_event(row: list[float] | int, k: int | None) -> TokenEvent | int:
    """The event of one row of :func:`logprob_table` for a request asking ``k`` logprobs (None: the
    bare token id, as the decode loop pushes it); a bare id (a step read without a table) is its own event."""
    if isinstance(row, int):
        return row
    tok = int(row[0])
    if k is None:
        return tok
    kk = (len(row) - 2) // 2
    k = min(k, kk)
    return TokenEvent(tok, row[1], [(int(i), v) for v, i in zip(row[2:2 + k], row[2 + kk:2 + kk + k], strict=True)])


def event_token(ev: TokenEvent | int) -> int:
    """The token id of an event as the decode loop pushes it (a bare id or a :class:`TokenEvent`)."""
    return ev if isinstance(ev, int) else ev.token_id


def request_generator(req: GenRequest, device: torch.device) -> torch.Generator | None:
    """The request's own sampler RNG (seeded, or fresh entropy); None when decoding is greedy."""
    if req.temperature <= 0:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(req.seed if req.seed is not None else int.from_bytes(os.urandom(4), "little"))
    return gen


def finish_check(req: GenRequest, tok: int, eos_ids: set[int], *, notify: bool = True) -> bool:
    """After ``tok`` was emitted: emit "done" and return True if the request is finished.
    ``notify=False`` only queues it (the caller wakes the handler, see :func:`wake`)."""
    if tok in eos_ids and not req.ignore_eos:
        (req.emit if notify else req.push)("done", "stop")
        return True
    if req.n_generated >= req.max_tokens:
        (req.emit if notify else req.push)("done", "length")
        return True
    return False


def drain_jobs(jobs: queue.Queue, pending: deque, score: Callable[[ScoreRequest], None], *, block: bool) -> None:
    """Move every queued job out of ``jobs``: scoring jobs run at once through ``score``, generation
    jobs join ``pending``. With ``block`` it waits for the first job (the worker has nothing to do).

    Both engines' worker loops start each step with this, so they admit work by the same rule.
    """
    while True:
        try:
            job = jobs.get(block=block)
        except queue.Empty:
            return
        block = False
        if isinstance(job, ScoreRequest):
            score(job)
        else:
            pending.append(job)


def prompt_logprobs(logits: torch.Tensor, ids: torch.Tensor,
                    top_k: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """Teacher-forced scoring: each prompt token's log-probability given the tokens before it.

    ``logits`` are the float logits of every prompt position ``[T, V]``, ``ids`` the prompt ``[T]``;
    returns the T-1 chosen-token logprobs and, per position, the top ``top_k`` (id, logprob) pairs.
    """
    lp = torch.log_softmax(logits, dim=-1)
    chosen = lp[:-1].gather(-1, ids[1:, None])[:, 0].tolist()
    top: list[list[tuple[int, float]]] = []
    if top_k > 0:
        vals, idx = torch.topk(lp[:-1], min(top_k, lp.shape[-1]), dim=-1)
        top = [list(zip(i, v, strict=False)) for i, v in zip(idx.tolist(), vals.tolist(), strict=False)]
    else:
        top = [[] for _ in chosen]
    return chosen, top


# --------------------------------------------------------------------------- the transformers engine


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
                 attn: str | None = None, threads: int | None = None, device: str = "cpu",
                 load: str = "fast", phases: Phases | None = None) -> None:
        from transformers import AutoTokenizer

        # `phases`: where the start-up's seconds go (server.py prints them as one line).
        phases = phases or Phases()
        self.threads = threads
        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        phases.mark("tokenizer")
        self.device = torch.device(device)
        init_device(device)
        phases.mark("cuda")
        self.model, self.load_path = load_model(model_dir, dtype=getattr(torch, dtype), device=device, attn=attn,
                                                how=load)
        phases.mark("load")
        cfg = self.model.config
        self.max_len = int(getattr(cfg, "max_position_embeddings", 2048))
        self.eos_ids = set(as_list(self.model.generation_config.eos_token_id or cfg.eos_token_id))
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
        phases.mark("other")

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
        ids = torch.tensor(job.prompt_ids, device=self.device)
        logits = self.model(input_ids=ids[None], use_cache=False).logits[0].float()
        job.loop.call_soon_threadsafe(job.future.set_result, prompt_logprobs(logits, ids, job.top_k))

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
                    ev = token_event(tok, logits, req.logprobs) if logits is not None else TokenEvent(tok)
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
            drain_jobs(self.jobs, pending, lambda job: self._safe(self._score, job), block=not seqs and not pending)
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

    def _prefill(self, req: GenRequest) -> tuple[_Seq, Any] | None:
        gen = request_generator(req, self.device)
        ids = torch.tensor([req.prompt_ids], device=self.device)
        # Only the last position's logits are needed: skip the LM head on the rest of the prompt.
        logits, new_cache = self._forward(ids, logits_to_keep=1)
        row = logits[0, -1].float()
        tok = sample_row(row, req, gen)
        req.n_generated += 1
        req.emit("token", token_event(tok, row, req.logprobs))
        seq = _Seq(req, gen, tok, len(req.prompt_ids))
        if finish_check(req, tok, self.eos_ids):
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
            tok = greedy[i] if req.temperature <= 0 else sample_row(logits[i], req, s.gen)
            req.n_generated += 1
            req.emit("token", token_event(tok, logits[i], req.logprobs))
            s.last = tok
            if not finish_check(req, tok, self.eos_ids):
                keep.append(i)
        return keep
