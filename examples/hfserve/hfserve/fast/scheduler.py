"""The fast engine's scheduler: requests in, tokens out, on one worker thread.

:class:`FastEngine` is the server's engine interface (``submit``, ``tokenizer``, ``max_len``) over
:class:`FastModel` and :class:`GraphDecoder`: continuous batching (requests join between decode steps and leave
as soon as they finish; a finished sequence's slot is refilled by moving the last one into it), chunked prefill
(``--prefill-chunk``), packed prefill (``--prefill-pack``), the prefill rounds before a decode step
(``--prefill-rounds``), the overlap schedule (``--overlap-schedule``: a step launched from the last step's ids on
the device before the host reads them), prompt scoring, and the events each request's handler streams.
"""

from __future__ import annotations

import gc
import os
import queue
import sys
import threading
import time
import types
from collections import deque
from typing import Any

import torch

from ..engine import (
    as_list,
    drain_jobs,
    event_token,
    finish_check,
    logprob_table,
    prompt_logprobs,
    request_generator,
    sample_row,
    table_event,
    token_event,
    wake,
)
from ..loading import Phases, init_device, load_model
from . import profiling
from .graphs import GraphDecoder
from .model import FastModel, set_pdl
from .profiling import Profiling, _gc_hook

SWITCH_INTERVAL_S = 0.0005
"""--overlap-schedule's GIL switch interval (``sys.setswitchinterval``): how long the engine thread can
wait for the GIL held by the event loop's streaming once a step's ids are in."""


class _Ahead:
    """A decode step on the device whose ids the host has not read: its rows (the sequences, in slot
    order at its launch), its ids on the device (the next step's input) and their copy to the host
    (:func:`_readout`'s: the bare ids, or a :func:`logprob_table` when some row asked for logprobs)."""

    __slots__ = ("rows", "ids", "host")

    def __init__(self, rows: list[_FSeq], ids: torch.Tensor, host: Any) -> None:
        self.rows, self.ids, self.host = rows, ids, host


def _readout(seqs: list[_FSeq], logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """What the host reads of a step over ``seqs`` (greedy ``ids`` from ``logits``), in one copy: the ids,
    or, when a greedy request asks for logprobs, a :func:`logprob_table` as wide as the most any asks for.
    Each read row becomes the request's event by :func:`table_event`."""
    ks = [s.req.logprobs for s in seqs if s.req.temperature <= 0 and s.req.logprobs is not None]
    return ids if not ks else logprob_table(logits[:len(seqs)], ids, max(ks))


class _FSeq:
    __slots__ = ("req", "gen", "last", "pos", "done_prompt", "done")

    def __init__(self, req: Any, gen: torch.Generator | None) -> None:
        self.req, self.gen, self.last, self.pos, self.done_prompt, self.done = req, gen, 0, 0, 0, False


class FastEngine(Profiling):
    """The server's engine interface (``submit``, ``tokenizer``, ``max_len``) over :class:`FastModel`."""

    # Defaults of the optional parts (set per instance in __init__; tests build engines without it).
    overlap = False
    prefill_rounds = 1
    _ahead: _Ahead | None = None
    _step_log_path: str | None = None
    _profile_path: str | None = None
    _timeline: deque | None = None

    def __init__(self, model_dir: str, *, dtype: str = "bfloat16", device: str = "cuda", max_batch_size: int = 8,
                 max_model_len: int = 4608, prefill_chunk: int = 0, cuda_graphs: bool = True,
                 sdpa: str = "auto", kernels: str = "torch", load: str = "fast", prefill_pack: int = 0,
                 prefill_attn: str = "torch", decode_attn: str = "default", kv_cache_dtype: str = "auto",
                 overlap_schedule: bool = False, prefill_rounds: int = 1, mm_glu: bool = False,
                 mm_norm: bool = False, pdl: bool = False, phases: Phases | None = None) -> None:
        from transformers import AutoTokenizer

        # `phases`: where the start-up's seconds go (server.py prints them as one line).
        phases = phases or Phases()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        phases.mark("tokenizer")
        init_device(device)
        phases.mark("cuda")
        hf, self.load_path = load_model(model_dir, dtype=getattr(torch, dtype), device=device, how=load)
        phases.mark("load")
        cfg = hf.config
        self.max_len = min(int(max_model_len), int(getattr(cfg, "max_position_embeddings", max_model_len)))
        self.max_batch = max(1, int(max_batch_size))
        # Slots: the decode batch, one staging slot for chunked prefill, one for scoring.
        self.stage_slot, self.score_slot = self.max_batch, self.max_batch + 1
        with torch.inference_mode():
            if kv_cache_dtype != "auto" and kernels == "torch":
                raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} needs the Triton kernels (--kernels triton*)")
            self.fm = FastModel(hf, slots=self.max_batch + 2, capacity=self.max_len, sdpa=sdpa, kernels="torch",
                                kv_cache_dtype=kv_cache_dtype)
        if self.fm.device.type == "cuda":
            torch.cuda.synchronize()
        phases.mark("build")  # fused weights (concatenated QKV, gate/up), the KV pool, RoPE tables
        self.fm.set_kernels(kernels)
        self.fm.set_prefill_attn(prefill_attn)
        self.fm.set_decode_attn(decode_attn)
        self.fm.set_mm_glu(mm_glu)
        self.fm.set_mm_norm(mm_norm)
        set_pdl(self.fm, pdl)
        phases.mark("kernels")  # Triton's import and checks, where asked for
        self.model = types.SimpleNamespace(config=cfg)  # what the HTTP layer reads (vocab size)
        del hf
        self.eos_ids = set(as_list(getattr(cfg, "eos_token_id", None)))
        self.chunk = max(0, int(prefill_chunk))
        self.pack = max(0, int(prefill_pack))
        if int(prefill_rounds) not in (1, 2):
            raise ValueError(f"prefill_rounds must be 1 or 2, not {prefill_rounds!r}")
        self.prefill_rounds = int(prefill_rounds)
        self.decoder = GraphDecoder(self.fm, self.max_batch, cuda_graphs)
        # HFSERVE_STEP_LOG=FILE: every decode step's (batch, time) appended to FILE whenever the batch empties
        # (the served step time, to set beside the client's inter-token latency; benchmarks/gpu/step_gaps.py).
        self._step_log_path = os.environ.get("HFSERVE_STEP_LOG") or None
        self._step_marks: list[tuple[int, float, float]] = []
        # ... and beside it, FILE.timeline: each job's arrival (``J time``) and each packed prefill pass
        # (``P prompts tokens start end device_ms``), same clock: where a burst's time goes before its first step.
        self._timeline: deque | None = deque() if self._step_log_path else None
        # ... and the cyclic garbage collector's passes of 1 ms or more (``G generation start ms``): a collection
        # holds the GIL for its whole pass, so a long one stalls the engine thread between two steps (--gc-freeze).
        self._gc_t0 = 0.0
        if self._timeline is not None:
            gc.callbacks.append(_gc_hook(self))
        self.overlap = bool(overlap_schedule)
        if self._step_log_path and self.decoder.use_graphs:
            self.decoder.timing = []
        # HFSERVE_PROFILE=FILE: torch.profiler over PROFILE_STEPS decode steps of the first batch of >= 32 rows
        # (after PROFILE_SKIP of them), its kernel table written to FILE: the served step's own profile.
        self._profile_path = os.environ.get("HFSERVE_PROFILE") or None
        for var, path in (("HFSERVE_STEP_LOG", self._step_log_path), ("HFSERVE_PROFILE", self._profile_path)):
            try:  # refused now, in one line, rather than by the worker thread mid-burst
                if path:
                    open(path, "a").close()
            except OSError as exc:
                raise SystemExit(f"hfserve: {var}={path} cannot be written: {exc.strerror}") from None
        self._profile: Any = None
        self._profile_seen = 0
        self._prefill_profiled = False
        self._ahead: _Ahead | None = None  # --overlap-schedule: the step on the device not read yet
        if self.overlap:
            # The engine thread must win the GIL back within a fraction of a step when its ids are in,
            # while the event loop streams the step before (CPython's default is 5 ms: ~a whole step).
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        with torch.inference_mode():
            secs = self.decoder.capture_all()
        if self.decoder.use_graphs:
            print(f"hfserve: captured {len(self.decoder.graphs)} decode graphs in {secs:.1f}s",
                  file=sys.stderr, flush=True)
        if self.fm.device.type == "cuda":
            torch.cuda.synchronize()
        phases.mark("capture")  # the decode graphs (and their warm-up runs), or the decoder's buffers without
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="hfserve-fast", daemon=True)
        self.thread.start()
        phases.mark("other")

    def submit(self, job: Any) -> None:
        """Queue a job for the worker thread."""
        if self._timeline is not None:
            self._timeline.append(f"J {time.perf_counter():.6f}")
        self.jobs.put(job)

    # -- worker ------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            self._loop()

    def _loop(self) -> None:
        active: list[_FSeq] = []  # decoding, in slots 0..len-1
        pending: deque = deque()
        filling: _FSeq | None = None  # a chunked prefill in progress (staging slot)
        late: list = []  # requests with events of the last decode step not yet woken (see _decode)
        again = False  # --prefill-rounds 2: this round only prefills the prompts that arrived during the last one's pass
        while True:
            # The last step's events wait for the next launch, unless none comes next (nothing active,
            # or a job first: a scoring pass, a prompt to prefill): then they are streamed now.
            if late and (not active or not self.jobs.empty()):
                wake(late)
                late = []
            drain_jobs(self.jobs, pending, self._safe_score, block=not active and not pending and filling is None)
            # A step launched ahead (--overlap-schedule) is read before a prefill changes the rows.
            if self._ahead is not None and (pending or filling is not None) and len(active) < self.max_batch:
                try:
                    active = self._settle(active)
                except Exception as exc:
                    active = self._failed(exc, active, [])
            if late and (pending or filling is not None) and len(active) < self.max_batch:  # a prefill comes first
                wake(late)
                late = []
            # Prefill: whole prompts first (chunk 0), or one chunk per step between decode steps.
            budget = self.chunk if self.chunk else None
            prefilled = False
            while (filling is not None or pending) and len(active) < self.max_batch:
                prefilled = True
                if filling is None and self.pack:
                    used = self._prefill_packed(pending, active, budget)
                    if used:
                        if budget is not None:
                            budget -= used
                            if budget <= 0:
                                break
                        continue
                    if not pending:  # every one left was cancelled
                        break
                if filling is None:
                    req = pending.popleft()
                    if req.cancelled:
                        continue
                    filling = _FSeq(req, self._generator(req))
                try:
                    done, used = self._prefill_some(filling, len(active), budget)
                except Exception as exc:  # a bad request must not kill the worker
                    print(f"hfserve: prefill failed: {exc!r}", file=sys.stderr, flush=True)
                    filling.req.emit("error", str(exc))
                    filling = None
                    continue
                if done:
                    s = filling
                    if not s.req.cancelled and not self._first_token(s, self._pending_logits):
                        active.append(s)
                    filling = None
                if budget is not None:
                    budget -= used
                    if budget <= 0:
                        break
            # --prefill-rounds 2: whole prompts that arrived while this round's pass ran are prefilled before
            # the next decode step (one more round, not more), instead of after one decode step of the rows
            # there (served C on the H200: 11 prompts, a batch-11 step, 53 prompts). Measured on the H200
            # (2026-12-04): C unchanged within the launch spread; D's TTFT p50 143 -> 188 ms (its c4 arrivals,
            # ~50 ms apart with one round, get grouped into passes the later ones wait for), TPOT 5.42 -> 5.26.
            if prefilled and not again and self.prefill_rounds > 1 and budget is None and len(active) < self.max_batch and not self.jobs.empty():
                again = True
                continue
            again = False
            if active:
                if self._step_log_path:
                    self._step_marks.append((len(active), time.perf_counter(), time.thread_time()))
                if self._profile_path and len(active) >= 32:
                    self._profile_step()
                try:
                    active, late = self._decode(active, late)
                except Exception as exc:
                    active = self._failed(exc, active, late)
                    late = []
                if not active and self._step_log_path and self._step_marks:
                    self._flush_step_log()

    def _failed(self, exc: Exception, active: list[_FSeq], late: list) -> list[_FSeq]:
        """A decode step failed: stream what was queued, end every decoding request with the error."""
        print(f"hfserve: decode failed: {exc!r}", file=sys.stderr, flush=True)
        self._ahead = None
        if late:
            wake(late)
        for s in active:
            s.req.emit("error", str(exc))
        return []

    def _generator(self, req: Any) -> torch.Generator | None:
        return request_generator(req, self.fm.device)

    def _prefill_some(self, s: _FSeq, row: int, budget: int | None) -> tuple[bool, int]:
        """Prefill up to ``budget`` prompt tokens of ``s``; (prompt finished, tokens used)."""
        ids = s.req.prompt_ids
        whole = budget is None or (s.done_prompt == 0 and len(ids) <= budget)
        slot = row if whole else self.stage_slot
        n = len(ids) - s.done_prompt if budget is None else min(budget, len(ids) - s.done_prompt)
        chunk = torch.tensor(ids[s.done_prompt:s.done_prompt + n], device=self.fm.device)
        logits = self.fm.prefill(chunk, slot, s.done_prompt)
        s.done_prompt += n
        if s.done_prompt < len(ids):
            return False, n
        if slot != row:
            self.fm.move_slot(slot, row, len(ids))
        s.pos = len(ids)
        s.last = -1
        self._pending_logits = logits[-1]
        return True, n

    def _prefill_packed(self, pending: deque, active: list[_FSeq], budget: int | None) -> int:
        """Prefill the queued whole prompts that fit together (``--prefill-pack`` tokens, the step's
        chunk budget, free slots) in one forward pass, straight into their decode slots; emit their
        first tokens and admit the unfinished ones to ``active``. Returns the tokens prefilled, 0
        when the next prompt does not fit whole (the one-prompt path then takes it, chunked)."""
        cap = self.pack if budget is None else min(self.pack, budget)
        group: list[_FSeq] = []
        used = 0
        while pending and len(active) + len(group) < self.max_batch:
            req = pending[0]
            if req.cancelled:
                pending.popleft()
                continue
            n = len(req.prompt_ids)
            if used + n > cap or n > self.fm.scratch_pos:  # too long: left to the one-prompt path
                break
            pending.popleft()
            group.append(_FSeq(req, self._generator(req)))
            used += n
        if not group:
            return 0
        rows = range(len(active), len(active) + len(group))
        parts = [(torch.tensor(s.req.prompt_ids, device=self.fm.device), row, 0) for s, row in zip(group, rows,
                                                                                                      strict=True)]
        mark = self._timeline is not None
        t0, ev0 = (time.perf_counter(), self._device_event()) if mark else (0.0, None)
        try:
            if self._profile_path and not self._prefill_profiled and used >= profiling.PROFILE_PREFILL_TOKENS:
                logits = self._profile_prefill(parts, used)
            else:
                logits = self.fm.prefill_packed(parts)
        except Exception as exc:  # a bad batch must not kill the worker
            print(f"hfserve: packed prefill failed: {exc!r}", file=sys.stderr, flush=True)
            for s in group:
                s.req.emit("error", str(exc))
            return used
        ev1 = self._device_event() if mark else None
        firsts = self._greedy_firsts(group, logits)
        if mark:
            dev = -1.0
            if ev0 is not None and ev1 is not None:
                ev1.synchronize()
                dev = ev0.elapsed_time(ev1)
            self._timeline.append(f"P {len(group)} {used} {t0:.6f} {time.perf_counter():.6f} {dev:.3f}")
        # Sequences that finish at once leave holes: the next admitted one moves into the first hole.
        for s, row, lg, ev in zip(group, rows, logits, firsts, strict=True):
            s.pos, s.last, s.done_prompt = len(s.req.prompt_ids), -1, len(s.req.prompt_ids)
            if s.req.cancelled or self._first_token(s, lg, notify=False, ev=ev):
                continue
            if row != len(active):
                self.fm.move_slot(row, len(active), s.pos)
            active.append(s)
        wake([s.req for s in group])  # one event-loop call for the whole group's first tokens
        return used

    @staticmethod
    def _greedy_firsts(group: list[_FSeq], logits: torch.Tensor) -> list[Any]:
        """The first tokens' events of a packed prefill's greedy requests, from one argmax and one
        :func:`logprob_table` over the group read back in one copy (None for a sampled request)."""
        if not any(s.req.temperature <= 0 for s in group):
            return [None] * len(group)
        rows = _readout(group, logits, torch.argmax(logits, dim=-1)).tolist()
        return [None if s.req.temperature > 0 else table_event(r, s.req.logprobs) for s, r in zip(group, rows, strict=True)]

    def _first_token(self, s: _FSeq, row: torch.Tensor, notify: bool = True, ev: Any = None) -> bool:
        """Emit the token sampled from the prompt's last logits ``row`` (or ``ev``, its event already
        built); True if the request is finished. ``notify=False`` only queues the events (the caller
        wakes the handlers)."""
        req = s.req
        if ev is None:
            tok = sample_row(row, req, s.gen)
            ev = token_event(tok, row, req.logprobs)
        else:
            tok = event_token(ev)
        req.n_generated += 1
        req.push("token", ev)
        s.last = tok
        done = finish_check(req, tok, self.eos_ids, notify=False)
        if notify:
            wake([req])
        return done

    def _decode(self, active: list[_FSeq], late: list) -> tuple[list[_FSeq], list]:
        """One decode step over ``active``; returns the sequences still decoding and the requests whose
        events this step queued, to be woken after the next step's launch (``late`` are the previous
        step's: they are woken here, once this step is queued on the device).

        Host work per request is a few attribute updates and a deque append: the sampled ids come
        back in one copy for the whole batch, a greedy request without logprobs gets its bare id (the
        HTTP side builds the event and detokenizes), and the handlers are woken by one event-loop
        call for the step, not one per token per request. That call comes *after* the next step is
        launched: the event loop's streaming of a step's tokens (detokenize, SSE, one socket write
        per stream: ~2 ms at batch 64) then runs while the device computes the next step and the
        engine thread waits on its ids with the GIL released, instead of between the sync and the
        next launch, where it held the GIL the launch needed (the device idle meanwhile).

        Greedy requests asking for logprobs get them from one :func:`logprob_table` for the step, queued
        right behind it and read back in that same one copy (the bench's and the gates' requests all
        ask for the chosen token's logprob: a log-softmax and a read per row cost ~2.4 ms per step at
        batch 64 on the H200).

        With ``--overlap-schedule`` and every sequence greedy, :meth:`_decode_ahead` does the step
        instead (and returns no late requests)."""
        if self.overlap and (self._ahead is not None or all(s.req.temperature <= 0 for s in active)):
            if late:  # a plain step came before: its events go now (the next launch is the first thing below)
                wake(late)
            return self._decode_ahead(active), []
        logits, ids = self.decoder.launch([s.last for s in active], [s.pos for s in active])
        out = _readout(active, logits, ids)
        if late:
            wake(late)
        rows = out.tolist()  # waits for the step: the step's one device->host copy (the logprobs with the ids)
        finished: list[int] = []
        eos = self.eos_ids
        for i, s in enumerate(active):
            s.pos += 1
            req = s.req
            if req.cancelled:
                finished.append(i)
                continue
            if req.temperature <= 0:
                ev = table_event(rows[i], req.logprobs)
                tok = event_token(ev)
                req.events.push("token", ev)
            else:
                tok = sample_row(logits[i], req, s.gen)
                req.events.push("token", token_event(tok, logits[i], req.logprobs))
            req.n_generated += 1
            s.last = tok
            if finish_check(req, tok, eos, notify=False):
                finished.append(i)
        step_reqs = [s.req for s in active]
        return self._refill(active, finished), step_reqs

    # -- --overlap-schedule: the next decode step launched before this one's ids are read -------------

    def _decode_ahead(self, active: list[_FSeq]) -> list[_FSeq]:
        """One decode step for greedy sequences, with the *next* step already on the device when the
        host reads this one's ids: its input ids are this step's output, copied on the device, so the
        host's work per step (reading the ids, events, finish checks, the event loop's streaming) runs
        while the device computes instead of between steps (SGLang's overlap scheduler, vLLM's async
        scheduling). Steps stay in order on one stream; the tokens are the plain path's, bit for bit.

        The step read here was launched by the call before (``self._ahead``), or now if none was. The
        next one is launched for the same rows unless this one ends them all by length; if this step
        finishes any row (a stop token, its length, a cancel), the next one is read too, its token
        for a finished row dropped (one step of that row computed for nothing), and the rows are then
        compacted as the plain path does. Returns the sequences still decoding."""
        cur = self._ahead or self._launch_ahead(active, None)
        nxt = None
        if any(s.req.n_generated + 1 < s.req.max_tokens for s in active):
            nxt = self._launch_ahead(active, cur)
        self._ahead = None
        wake(self._read_ahead(cur))
        if nxt is not None and not any(s.done for s in active):
            self._ahead = nxt
            return active
        if nxt is not None:
            wake(self._read_ahead(nxt))
        return self._compact(active)

    def _launch_ahead(self, active: list[_FSeq], prev: _Ahead | None) -> _Ahead:
        """Queue a step for ``active``: from the host's last tokens, or from ``prev``'s ids on the device
        (``prev`` not read yet: the positions are one past the host's)."""
        if prev is None:
            logits, ids = self.decoder.launch([s.last for s in active], [s.pos for s in active])
        else:
            logits, ids = self.decoder.launch(None, [s.pos + 1 for s in active], prev=prev.ids)
        return _Ahead(list(active), ids, self.decoder.copy_out(_readout(active, logits, ids)))

    def _read_ahead(self, step: _Ahead) -> list:
        """Wait for ``step``'s ids and queue their events, as the plain path does; a row already finished
        at an earlier step gets nothing. Returns the requests to wake."""
        vals = step.host.tolist()
        reqs = []
        eos = self.eos_ids
        for s, v in zip(step.rows, vals, strict=True):
            if s.done:
                continue
            s.pos += 1
            req = s.req
            if req.cancelled:
                s.done = True
                continue
            ev = table_event(v, req.logprobs)
            tok = event_token(ev)
            req.events.push("token", ev)
            req.n_generated += 1
            s.last = tok
            if finish_check(req, tok, eos, notify=False):
                s.done = True
            reqs.append(req)
        return reqs

    def _settle(self, active: list[_FSeq]) -> list[_FSeq]:
        """Read the step launched ahead (something other than a decode step comes next)."""
        step, self._ahead = self._ahead, None
        if step is not None:
            wake(self._read_ahead(step))
        return self._compact(active)

    def _compact(self, active: list[_FSeq]) -> list[_FSeq]:
        """Drop the rows marked done (:meth:`_refill`)."""
        return self._refill(active, [i for i, s in enumerate(active) if s.done])

    def _refill(self, active: list[_FSeq], finished: list[int]) -> list[_FSeq]:
        """Drop rows ``finished`` (ascending), refilling holes from the end, so decoding slots stay 0..n-1
        (KV moves, not gathers)."""
        for i in reversed(finished):
            last = len(active) - 1
            if i != last:
                self.fm.move_slot(last, i, active[last].pos)
                active[i] = active[last]
            active.pop()
        return active

    def _safe_score(self, job: Any) -> None:
        try:
            job.loop.call_soon_threadsafe(job.future.set_result, self._score(job))
        except Exception as exc:  # report to the client instead of killing the worker
            print(f"hfserve: scoring failed: {exc!r}", file=sys.stderr, flush=True)
            job.loop.call_soon_threadsafe(job.future.set_exception, exc)

    def _score(self, job: Any) -> tuple[list[float], list[list[tuple[int, float]]]]:
        """Teacher-forced log-probabilities of the prompt through the serving prefill path."""
        ids = torch.tensor(job.prompt_ids, device=self.fm.device)
        step = self.chunk or len(job.prompt_ids)
        parts = [self.fm.prefill(ids[s:s + step], self.score_slot, s, all_logits=True)
                 for s in range(0, len(job.prompt_ids), step)]
        return prompt_logprobs(torch.cat(parts), ids, job.top_k)
