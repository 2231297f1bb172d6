"""aiohttp load generator: closed-loop workers or an open-loop arrival schedule.

Timing rules: ``t_sent`` is taken right before the POST is issued; each SSE read is stamped
once with ``perf_counter_ns`` when its bytes arrive (events in one read arrived together).
Any failure (reset, 5xx, malformed SSE, timeout, truncated stream) becomes a failed record
with a reason, never an exception out of the run.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp

from gates.api import ApiMode

from . import bounds
from .metrics import compute_metrics, failures
from .prompts import Prompt, PromptFactory, load_tokenizer
from .results import ScenarioResult
from .scenarios import Scenario, StopRule, arrival_offsets, load_trace
from .timeline import RequestRecord

try:  # orjson is ~3x faster per chunk; the stdlib is the fallback
    import orjson

    _loads = orjson.loads
    _dumps = orjson.dumps
except ImportError:  # pragma: no cover
    import json

    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

_JSON_HEADERS = {"Content-Type": "application/json"}
STOPPED = "stopped_early"
"""The error of a measured request the bench cancelled because its scenario was stopped early
(`Scenario.stop`): not a failure of the server's; such a scenario's metrics leave it out."""

_now = time.perf_counter_ns


def build_payload(api: str, model: str, p: Prompt, mode: ApiMode = ApiMode()) -> dict[str, Any]:
    """OpenAI request body: pinned output length, streaming with usage, token ids returned.

    The ids (``return_tokens_as_token_ids`` on the sampled token's logprob) let the client count
    output tokens exactly: text chunks are not tokens, and re-tokenizing text miscounts (a
    byte-level tokenizer's half characters arrive as U+FFFD). The accuracy gate sends the same
    request shape, so a server cannot be honest only when logprobs are asked for. An engine that
    refuses some of these fields (``mode``, from the target's capabilities) is sent the rest, as
    the gates send them (gates/api.py).
    """
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": p.output_tokens,
        "ignore_eos": True,  # pin OSL (vLLM/SGLang/our server extension)
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_tokens_as_token_ids": True,
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": p.prompt}]
        body.update(logprobs=True, top_logprobs=0)
    else:
        body["prompt"] = p.prompt
        body["logprobs"] = 0
    return mode.body(body)


def _logprob_tokens(ev: dict[str, Any], chat: bool) -> list[Any] | None:
    """The generated tokens this event's logprobs list (None: the event has no logprobs)."""
    ch = ev.get("choices") or ()
    lp = ch[0].get("logprobs") if ch else None
    if not lp:
        return None
    return [c.get("token") for c in lp.get("content") or ()] if chat else list(lp.get("tokens") or ())


def _token_ids(tokens: list[Any]) -> list[int]:
    """Those tokens as ids (``token_id:N``, from ``return_tokens_as_token_ids``); [] when they are text."""
    out = []
    for t in tokens:
        if not (isinstance(t, str) and t.startswith("token_id:")):
            return []  # tokens as text: this engine does not return ids
        try:
            out.append(int(t[9:]))
        except ValueError:
            return []
    return out


def _content(ev: dict[str, Any], chat: bool) -> str:
    ch = ev.get("choices") or ()
    if not ch:
        return ""
    c0 = ch[0]
    if chat:
        delta = c0.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content") or ""
    return c0.get("text") or ""


async def send_request(session: aiohttp.ClientSession, url: str, body: bytes | dict[str, Any],
                       rec: RequestRecord, *, chat: bool, timeout_s: float) -> RequestRecord:
    """Stream one request, filling ``rec``.  Never raises (except cancellation).

    ``body`` should be pre-encoded JSON bytes so serialization stays outside the timed window.
    """
    parts: list[str] = []
    data = body if isinstance(body, bytes) else _dumps(body)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    rec.t_sent_ns = _now()
    try:
        async with session.post(url, data=data, headers=_JSON_HEADERS, timeout=timeout) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                rec.error = f"http_{resp.status}"
                rec.error_detail = (await resp.text())[:300]
                rec.t_done_ns = _now()
                return rec
            buf = b""
            async for data in resp.content.iter_any():
                t = _now()
                buf += data
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line = buf[:nl].strip()
                    buf = buf[nl + 1:]
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, event:/id: fields
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        rec.done_seen = True
                        continue
                    if rec.t_first_chunk_ns is None:
                        rec.t_first_chunk_ns = t
                    ev = _loads(payload)
                    if not isinstance(ev, dict):
                        raise ValueError("SSE data is not a JSON object")
                    if ev.get("error"):
                        rec.error = "server_error"
                        rec.error_detail = str(ev["error"])[:300]
                    txt = _content(ev, chat)
                    if txt:
                        if rec.t_first_token_ns is None:
                            rec.t_first_token_ns = t
                        rec.t_last_token_ns = t
                        rec.chunk_ns.append(t)
                        parts.append(txt)
                    tokens = _logprob_tokens(ev, chat)
                    if tokens is not None:
                        rec.client_tokens = (rec.client_tokens or 0) + len(tokens)
                        rec.output_ids += _token_ids(tokens)
                    for ch in ev.get("choices") or ():
                        rec.finish_reason = ch.get("finish_reason") or rec.finish_reason
                    u = ev.get("usage")
                    if u:
                        rec.usage_prompt_tokens = u.get("prompt_tokens")
                        rec.usage_completion_tokens = u.get("completion_tokens")
            rec.t_done_ns = _now()
    except asyncio.TimeoutError:
        rec.error, rec.error_detail = "timeout", f"no completion within {timeout_s}s"
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError) as e:
        rec.error, rec.error_detail = "connection_error", repr(e)[:300]
    except ValueError as e:  # JSON decode errors (orjson.JSONDecodeError is a ValueError)
        rec.error, rec.error_detail = "malformed_sse", repr(e)[:300]
    except aiohttp.ClientError as e:
        rec.error, rec.error_detail = "client_error", repr(e)[:300]
    rec.client_chunks = len(rec.chunk_ns)
    rec.text = "".join(parts)
    if rec.error is None:
        # A body that ends without [DONE] means the server died mid-stream, unless it said why it
        # finished: `transformers serve` ends its streams after the finish_reason + usage chunk.
        if not rec.done_seen and rec.finish_reason is None:
            rec.error = "incomplete_stream"
        elif rec.output_tokens >= 1 and not rec.chunk_ns:
            rec.error = "empty_output"
    if rec.t_done_ns is None:
        rec.t_done_ns = _now()
    rec.success = rec.error is None
    return rec


class _LagMonitor:
    """Event-loop lag: how late a 10 ms sleep wakes up (client saturation signal)."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t0 = _now()
            await asyncio.sleep(self.period_s)
            self.lags_ms.append(max(0.0, (_now() - t0) / 1e6 - self.period_s * 1e3))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


async def _closed_loop(session, url, bodies, recs, concurrency, chat, timeout_s) -> None:
    nxt = iter(range(len(bodies)))

    async def worker() -> None:
        for i in nxt:  # shared iterator: each worker takes the next request when free
            recs[i].t_scheduled_ns = _now()
            await send_request(session, url, bodies[i], recs[i], chat=chat, timeout_s=timeout_s)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(bodies))))))


async def _open_loop(session, url, bodies, recs, offsets, cap, chat, timeout_s) -> None:
    sem = asyncio.Semaphore(cap) if cap and cap > 0 else None
    start = _now()

    async def one(i: int) -> None:
        if sem is None:
            await send_request(session, url, bodies[i], recs[i], chat=chat, timeout_s=timeout_s)
            return
        async with sem:  # waiting here is client queue time (t_sent − t_scheduled)
            await send_request(session, url, bodies[i], recs[i], chat=chat, timeout_s=timeout_s)

    tasks = []
    try:
        for i, off in enumerate(offsets):
            recs[i].t_scheduled_ns = start + int(off * 1e9)
            delay = (recs[i].t_scheduled_ns - _now()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    finally:  # stopped early (cancelled) while sending: the requests already sent are cancelled and awaited, none left behind
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)


POLL_S = 0.02
"""How often a rule with a latency bound is checked while its scenario runs (a throughput's bound is
checked when it can first cross: it only falls with time)."""


async def _stop_when_out_of_reach(measured: Any, t0: int, rule: StopRule, recs: list[RequestRecord], possible: int,
                                  pinned: bool) -> tuple[float, float, dict[str, float]] | None:
    """Await `measured` (the scenario's measured requests, filling `recs`), cancelling them as soon as the
    speedups `rule` names can no longer reach `rule.below` (`bounds.speedup_bound`: output tok/s ends at most at
    `possible` tokens, every request's max_tokens, over the time elapsed since `t0`; a latency statistic at
    least that of the requests' bounds so far). Returns (the seconds elapsed when it stopped them, the
    product's bound then, each metric's bound then), or None when they all finished first."""
    task = asyncio.ensure_future(measured)
    throughput_only = all(k == bounds.THROUGHPUT for k, _ in rule.speedups)
    try:
        while not task.done():
            now = _now()
            elapsed = (now - t0) / 1e9
            bound, values = bounds.speedup_bound(rule.speedups, recs, possible, t0, now, pinned=pinned)
            if bound < rule.below:
                task.cancel()
                await asyncio.wait({task})  # every request cancelled, its connection closed
                return elapsed, bound, values
            if throughput_only:  # (possible / elapsed)^k / prod(base) falls under below at this elapsed
                base = math.prod(b for _, b in rule.speedups)
                cross = possible / (rule.below * base) ** (1 / len(rule.speedups)) if rule.below > 0 and base > 0 else math.inf
                wait = max(cross - elapsed, 0.0) + 1e-3
            else:
                wait = POLL_S
            await asyncio.wait({task}, timeout=None if math.isinf(wait) else wait)
    finally:
        if not task.done():  # we were cancelled ourselves: take the requests with us
            task.cancel()
            await asyncio.wait({task})
    task.result()  # its own exception, if any
    return None


def _stopped(scenario: Scenario, recs: list[RequestRecord], prompts: list[Prompt], t0: int, stop: tuple[float, float, dict[str, float]],
             mode: ApiMode, lags: list[float], tok: Any, chat: bool) -> dict[str, float]:
    """The metrics of a scenario stopped early (`Scenario.stop`): the requests that finished before the
    stop (their failures and counts judged as ever; the unfinished ones marked `STOPPED`, not failed),
    `output_throughput` the *bound* every request's max_tokens over the seconds elapsed gives, and each
    metric of the rule its bound at the stop, the values the stop was proven with (`stopped_early` = 1
    says so; `stop_below` the rule's, `stop_bound` the speedups' product then)."""
    elapsed, bound, values = stop
    for r in recs:
        if not r.success and r.error is None:
            r.error, r.error_detail = STOPPED, f"stopped {elapsed:.3f} s into the scenario: out of reach of the screen's bar"
            r.t_done_ns = r.t_done_ns or t0 + int(elapsed * 1e9)
    done = [r for r in recs if r.error != STOPPED]
    possible = sum(p.output_tokens for p in prompts)
    m = compute_metrics(done, bench_start_ns=t0, bench_end_ns=t0 + int(elapsed * 1e9), target_rate=scenario.rate,
                        slo_ttft_ms=scenario.slo_ttft_ms, slo_tpot_ms=scenario.slo_tpot_ms, slo_e2e_ms=scenario.slo_e2e_ms,
                        loop_lag_ms=lags, intended_prompt_check=tok is not None and not chat and mode.prompt_ids, mode=mode)
    m.update(stopped_early=1.0, stopped_requests=float(len(recs) - len(done)),
             stop_below=float(scenario.stop.below if scenario.stop else 0.0), stop_bound=float(bound),
             output_tokens_possible=float(possible), output_tokens_seen=float(sum(r.osl for r in recs if r.success or r.error == STOPPED)),
             duration_s=elapsed, output_throughput=possible / elapsed)  # the very seconds the stop was proven at
    m.update(values)
    return m


async def run_scenario(base_url: str, model: str, scenario: Scenario, *, tokenizer: Any = None,
                       api: str = "completions", timeout_s: float = 60.0,
                       capabilities: dict[str, Any] | None = None) -> ScenarioResult:
    """Run warmup (discarded) then the measured requests; always returns a result.

    ``capabilities``: what the engine's API lacks (a target's ``[capabilities]``); requests then
    leave out what it refuses, and outputs are counted and judged as :func:`compute_metrics` says."""
    if api not in ("completions", "chat"):
        raise ValueError("api must be 'completions' or 'chat'")
    chat = api == "chat"
    mode = ApiMode.of(capabilities)
    tok = load_tokenizer(tokenizer)
    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    if base_url.rstrip("/").endswith("/v1"):
        url = base_url.rstrip("/") + ("/chat/completions" if chat else "/completions")
    factory = PromptFactory(scenario, tok, text=chat or not mode.prompt_ids)
    lo, hi = scenario.part or (0, scenario.num_requests)
    if scenario.arrival == "trace":
        prompts = [factory.from_trace(e) for e in load_trace(scenario.trace_path or "")]
        prompts = prompts[: scenario.num_requests][lo:hi]  # a trace's fill draws in order: all drawn, then the part
    else:
        prompts = [factory.make(i) for i in range(lo, hi)]
    offsets = arrival_offsets(scenario)  # the whole scenario's schedule (a vLLM-scaled one depends on its length)
    if offsets is not None and scenario.part is not None:
        # A part goes on the whole scenario's schedule; a continuation's first request waits its own
        # gap after the request before it (the time between the passes is no part of the schedule).
        start = offsets[lo - 1] if 0 < lo <= len(offsets) else 0.0
        offsets = [o - start for o in offsets[lo:hi]]
    warm = [factory.make(i, warmup=True) for i in range(scenario.warmup_requests)]

    def mk(ps: list[Prompt], first: int = 0) -> tuple[list[bytes], list[RequestRecord]]:
        return ([_dumps(build_payload(api, model, p, mode)) for p in ps],
                [RequestRecord(index=first + i, prompt_tokens=p.prompt_tokens, output_tokens=p.output_tokens)
                 for i, p in enumerate(ps)])

    limit = max(scenario.concurrency, 1) if scenario.arrival == "closed" else scenario.concurrency
    connector = aiohttp.TCPConnector(limit=limit if limit > 0 else 0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector) as session:
        if warm:  # warmup: same shape, separate prompts, results dropped
            wb, wr = mk(warm)
            await _closed_loop(session, url, wb, wr, max(1, scenario.concurrency), chat, timeout_s)
        bodies, recs = mk(prompts, lo)
        lag = _LagMonitor()
        lag.start()
        t0 = _now()
        if offsets is None:
            measured = _closed_loop(session, url, bodies, recs, scenario.concurrency, chat, timeout_s)
        else:
            measured = _open_loop(session, url, bodies, recs, offsets, scenario.concurrency, chat, timeout_s)
        stopped = None
        if scenario.stop is not None and prompts:
            stopped = await _stop_when_out_of_reach(measured, t0, scenario.stop, recs, sum(p.output_tokens for p in prompts),
                                                    pinned=mode.ignore_eos)
        else:
            await measured
        t1 = _now()
        await lag.stop()
    if not mode.token_ids and tok is not None:  # counted after the clock stopped: no client CPU in the numbers
        for r in recs:
            r.client_tokens = len(tok(r.text, add_special_tokens=False)["input_ids"]) if r.success else None
            r.client_tokens_from_text = True
    if stopped is not None:
        metrics = _stopped(scenario, recs, prompts, t0, stopped, mode, lag.lags_ms, tok, chat)
    else:
        metrics = compute_metrics(
            recs, bench_start_ns=t0, bench_end_ns=t1, target_rate=scenario.rate,
            slo_ttft_ms=scenario.slo_ttft_ms, slo_tpot_ms=scenario.slo_tpot_ms,
            slo_e2e_ms=scenario.slo_e2e_ms, loop_lag_ms=lag.lags_ms,
            intended_prompt_check=tok is not None and not chat and mode.prompt_ids, mode=mode)
    return ScenarioResult(scenario=scenario, metrics=metrics, requests=recs,
                          failures=failures([r for r in recs if r.error != STOPPED]),
                          meta={"base_url": base_url, "model": model, "api": api, "engine_api": mode.describe(),
                                "origin_ns": t0, "tokenizer": tok is not None,
                                "date": time.strftime("%Y%m%d-%H%M%S"),
                                # a part is joined with the other passes later: the raw lags it joins with theirs
                                **({"part": [lo, hi], "loop_lag_ms": [round(x, 3) for x in lag.lags_ms]}
                                   if scenario.part is not None else {})})


def run_scenario_sync(base_url: str, model: str, scenario: Scenario, *, tokenizer: Any = None,
                      api: str = "completions", timeout_s: float = 60.0,
                      capabilities: dict[str, Any] | None = None) -> ScenarioResult:
    """Blocking wrapper around :func:`run_scenario` (own stdlib event loop; uvloop was not
    consistently faster in the client-ceiling runs, see docs/results.md)."""
    return asyncio.run(run_scenario(base_url, model, scenario, tokenizer=tokenizer, api=api,
                                    timeout_s=timeout_s, capabilities=capabilities))
