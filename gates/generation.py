"""Generation check: what the server *generates*, judged by the float32 reference.

The teacher-forced check (:mod:`gates.accuracy`) judges how a server scores prompts. A server
can be honest there and broken where the bench looks: decoding with a smaller model, a buggy
quantized or speculative decode, a batching bug that only shows under concurrency, or a
response cache. This check sends greedy generation requests and judges every continuation.

Prompts: ``pairs`` pairs of held-out windows, all of one token length and all distinct. The
second prompt of a pair shares all but its last ``tail_tokens`` ids with the first, so a cache
keyed on the prompt's length or on a prefix answers it with the first prompt's continuation.
The first prompts go out *together* (so a batching server decodes them in one batch), the
second ones one at a time afterwards; the request shapes (completions / chat, streamed / not)
rotate over the prompts. Every request asks for ``new_tokens`` tokens with ``ignore_eos`` and
returns its token ids (``return_tokens_as_token_ids`` with logprobs), so counts are exact.

Per continuation, the reference scores the served tokens teacher-forced and generates its own
greedy continuation. Metrics (limits in ``gates/thresholds.toml``):

* ``gen_offtop_rate`` - served tokens whose reference log-prob is more than ``margin`` below the
  reference's top-1 at that position. An honest server in bf16 or batched flips greedy tokens
  only at near-ties (inside the margin) and is judged on its own history afterwards.
* ``gen_offtop_worst`` - the same rate for the worst single prompt: prompt dependence is judged
  prompt by prompt, so one prompt answered with another's continuation shows.
* ``gen_nll_excess`` - reference NLL per token of the served continuation minus that of the
  reference's own greedy continuation.
* ``gen_prefix_short`` - 1 - mean fraction of the continuation that agrees with the reference's
  greedy continuation from the start (soft signal: an honest near-tie flip ends the prefix).

A count that differs from ``new_tokens``, a usage that differs from the counted ids, or a
prompt whose ids the server reports differently is a failure outright (:class:`GenerationError`).

An engine without ``ignore_eos``, token ids or id prompts (:mod:`gates.api`) is asked without
them: its text is spelled back into ids with the reference's help (:mod:`gates.textalign`) and
scored the same way, or by the tokenizer's own spelling where that one leaves fewer tokens off the
reference's top (the aligner takes the reference's top token whenever it fits the text, which can
strand the rest: a newline and 3 spaces where the server sent a newline and 7 left 4 single spaces
at gaps of 2-4 nats; the plain spelling scored them all on top); counts agree
within ``retokenize_tolerance``; a reply that stops early has its EOS scored as one more served
token, and an EOS more than ``eos_gap_limit`` below the reference's top-1 fails outright.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gates._http import GateHTTPError, post_json, post_stream
from gates.api import ApiMode
from gates.reference import reference_greedy, reference_greedy_many, score_many
from gates.textalign import align_text

__all__ = ["GenerationError", "Probe", "check_generation", "draw_probes", "fewer_off_top", "reference_greedy", "reference_greedy_many",
           "score_many", "summarize_generation"]

SHAPES = (("completions", False), ("completions", True), ("chat", True), ("chat", False))


class GenerationError(ValueError):
    """The server's generation reply is wrong in a way no tolerance covers (counts, usage)."""


@dataclass(frozen=True)
class Probe:
    """One generation request of the check."""

    content_ids: list[int]
    """The held-out window (completions send BOS + these ids; chat sends their text)."""
    api: str
    stream: bool
    concurrent: bool


def draw_probes(heldout: Sequence[int], rng: random.Random, *, pairs: int, length: int, tail: int,
                chat: bool) -> list[Probe]:
    """``2 * pairs`` distinct prompts of ``length`` ids; the second of a pair shares the first's prefix."""
    if len(heldout) <= 2 * length or not 0 < tail < length:
        raise ValueError(f"held-out text of {len(heldout)} tokens cannot give windows of {length} with tail {tail}")
    shapes = [s for s in SHAPES if chat or s[0] == "completions"]
    firsts: list[list[int]] = []
    seconds: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    while len(firsts) < pairs:
        a = list(heldout[(s := rng.randrange(len(heldout) - length)):s + length])
        t = rng.randrange(len(heldout) - tail)
        b = a[:length - tail] + list(heldout[t:t + tail])
        if tuple(a) in seen or tuple(b) in seen or a == b or b[-1] == a[-1]:
            continue
        seen.update({tuple(a), tuple(b)})
        firsts.append(a)
        seconds.append(b)
    # A pair keeps one request shape, so a cache keyed on (shape, prefix or length) is hit too.
    probes = [Probe(a, *shapes[i % len(shapes)], concurrent=True) for i, a in enumerate(firsts)]
    probes += [Probe(b, *shapes[i % len(shapes)], concurrent=False) for i, b in enumerate(seconds)]
    return probes


def _ids_of(tokens: Sequence[str] | None) -> list[int]:
    out = []
    for t in tokens or ():
        if not isinstance(t, str) or not t.startswith("token_id:"):
            raise GenerationError(f"server returned token {t!r} instead of 'token_id:N' (return_tokens_as_token_ids)")
        out.append(int(t.split(":", 1)[1]))
    return out


def _chat_tokens(lp: Mapping[str, Any] | None) -> list[str]:
    return [c.get("token") for c in ((lp or {}).get("content") or [])]


@dataclass(frozen=True)
class _Reply:
    ids: list[int]
    """Generated ids as delivered (empty when the engine returns none)."""
    usage: dict | None
    finish: str | None
    text: str


def _send(base_url: str, model: str, probe: Probe, prompt: Any, n: int, timeout: float,
          mode: ApiMode = ApiMode()) -> _Reply:
    """Send one greedy request; return what the server delivered, exactly as it delivered it."""
    body: dict[str, Any] = {"model": model, "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
                            "return_tokens_as_token_ids": True}
    chat = probe.api == "chat"
    if chat:
        body.update(messages=[{"role": "user", "content": prompt}], logprobs=True, top_logprobs=0)
    else:
        body.update(prompt=prompt, logprobs=0)
    body = mode.body(body)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not probe.stream:
        reply, _ = post_json(base_url, path, body, timeout=timeout)
        ch = reply["choices"][0]
        lp = ch.get("logprobs")
        text = (ch.get("message") or {}).get("content") if chat else ch.get("text")
        return _Reply(_ids_of(_chat_tokens(lp) if chat else (lp or {}).get("tokens")), reply.get("usage"),
                      ch.get("finish_reason"), text or "")
    events = post_stream(base_url, path, {**body, "stream": True, "stream_options": {"include_usage": True}},
                         timeout=timeout)
    ids: list[int] = []
    usage = finish = None
    parts: list[str] = []
    for ev in events:
        if ev.get("error"):
            raise GateHTTPError(f"stream error: {str(ev['error'])[:200]}")
        for ch in ev.get("choices") or ():
            lp = ch.get("logprobs")
            ids += _ids_of(_chat_tokens(lp) if chat else (lp or {}).get("tokens"))
            parts.append(((ch.get("delta") or {}).get("content") if chat else ch.get("text")) or "")
            finish = ch.get("finish_reason") or finish
        usage = ev.get("usage") or usage
    return _Reply(ids, usage, finish, "".join(parts))


def _prompt_of(probe: Probe, tok: Any, mode: ApiMode = ApiMode()) -> tuple[Any, list[int]]:
    """(what to send, the prompt ids the server should see) for a probe."""
    if probe.api == "chat":
        text = tok.decode(probe.content_ids)
        templated = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=False)
        return text, list(tok(templated, add_special_tokens=False)["input_ids"])
    bos = getattr(tok, "bos_token_id", None)
    ids = ([bos] if bos is not None else []) + probe.content_ids
    return mode.prompt(tok, ids)


def check_generation(base_url: str, served_model: str, model: Any, tok: Any, probes: Sequence[Probe],
                     cfg: Mapping[str, Any], mode: ApiMode = ApiMode(),
                     timing: dict[str, float] | None = None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Run every probe against the server and score it; returns (metrics, per-prompt records).

    ``timing``, when given, receives the seconds from the first request to: the concurrent phase's
    replies (``server_concurrent``), every reply (``server``), the reference's greedy continuations
    (``reference_greedy``, on its own thread meanwhile), and the scoring after them (``scoring``).

    Raises:
        GenerationError: a count, usage or prompt length that disagrees with the request.
        GateHTTPError, KeyError, IndexError, TypeError: the server failed or answered malformed.
    """
    n, timeout, margin = int(cfg["new_tokens"]), float(cfg["timeout_s"]), float(cfg["margin"])
    prompts = [_prompt_of(p, tok, mode) for p in probes]
    replies: list[_Reply | None] = [None] * len(probes)
    together = [i for i, p in enumerate(probes) if p.concurrent]
    clock = timing if timing is not None else {}
    t0 = time.perf_counter()

    def greedy() -> None:  # the prompts are all of one length: one batch, n decode steps in all
        reference_greedy_many(model, [ids for _, ids in prompts], n)
        clock["reference_greedy"] = time.perf_counter() - t0

    # The reference's greedy continuations depend on the prompts alone: they are computed on a
    # thread of their own while the server generates (the requests go out exactly as before), and
    # the scoring below reads them from the cache.
    with ThreadPoolExecutor(max_workers=1) as ref_pool:
        ref_done = ref_pool.submit(greedy)
        with ThreadPoolExecutor(max_workers=max(1, len(together))) as pool:
            futures = {i: pool.submit(_send, base_url, served_model, probes[i], prompts[i][0], n, timeout, mode)
                       for i in together}
            for i, fut in futures.items():
                replies[i] = fut.result()
        clock["server_concurrent"] = time.perf_counter() - t0
        for i, p in enumerate(probes):
            if not p.concurrent:
                replies[i] = _send(base_url, served_model, p, prompts[i][0], n, timeout, mode)
        clock["server"] = time.perf_counter() - t0
        ref_done.result()
    t_score = time.perf_counter()

    # Every reply's counts first, in probe order, up to the first that is wrong; then the replies
    # before it are scored together (one batched reference forward) and judged in the same order,
    # so the error raised is the one a probe-by-probe pass would raise first.
    checked: list[tuple[Probe, list[int], list[int], bool, str, list[int] | None]] = []
    wrong: Exception | None = None
    for probe, (_, prompt_ids), reply in zip(probes, prompts, replies, strict=True):
        assert reply is not None
        shape = f"{probe.api}{' stream' if probe.stream else ''}{' concurrent' if probe.concurrent else ''}"
        try:
            served, stopped, plain = _checked_counts(reply, probe, shape, n, prompt_ids, (model, tok), mode, cfg)
        except Exception as exc:  # noqa: BLE001 - raised below, after the probes before it are judged
            wrong = exc
            break
        # An early stop is one more generated token, EOS, judged like the others (gates.api).
        eos = [tok.eos_token_id] if stopped else []
        checked.append((probe, prompt_ids, served + eos, stopped, shape, plain + eos if plain is not None else None))
    records: list[dict[str, Any]] = []
    scores = score_many(model, [(prompt_ids, scored) for _, prompt_ids, scored, _, _, _ in checked])
    others = iter(score_many(model, [(c[1], c[5]) for c in checked if c[5] is not None]))
    for (probe, prompt_ids, scored, stopped, shape, plain), (gaps, nll) in zip(checked, scores, strict=True):
        if plain is not None:  # the spelling that leaves fewer tokens off the top (then the smaller gaps)
            other = next(others)
            if fewer_off_top(gaps, other[0], margin):
                scored, (gaps, nll) = plain, other
        served = scored[:-1] if stopped else scored
        greedy, nll_ref = reference_greedy(model, prompt_ids, n)
        if stopped and gaps[-1] > float(cfg["eos_gap_limit"]):
            raise GenerationError(f"{shape}: stopped at EOS after {len(served)} of {n} tokens where the reference "
                                  f"puts EOS {gaps[-1]:.2f} below its top choice (limit {cfg['eos_gap_limit']})")
        prefix = next((j for j, (a, b) in enumerate(zip(scored, greedy, strict=False)) if a != b), min(len(scored), n))
        records.append({"shape": shape, "concurrent": probe.concurrent, "offtop": sum(g > margin for g in gaps),
                        "gaps": sorted(round(g, 3) for g in gaps if g > 1e-6), "prefix": prefix,
                        "nll": nll, "nll_ref": nll_ref, "tokens": len(scored)})
    if wrong is not None:
        raise wrong
    clock["scoring"] = time.perf_counter() - t_score
    return summarize_generation(records, n), records


def fewer_off_top(gaps: Sequence[float], other: Sequence[float], margin: float) -> bool:
    """Does the spelling scored ``other`` leave fewer tokens more than ``margin`` below the reference's top than
    the one scored ``gaps`` (and, as many, smaller gaps in all)? Two spellings of one text: the kinder is judged."""
    return (sum(g > margin for g in other), sum(other)) < (sum(g > margin for g in gaps), sum(gaps))


def _checked_counts(reply: _Reply, probe: Probe, shape: str, n: int, prompt_ids: list[int], ref: tuple[Any, Any],
                    mode: ApiMode, cfg: Mapping[str, Any]) -> tuple[list[int], bool, list[int] | None]:
    """(the served ids to score, stopped early at EOS, another spelling of them to score or None) of one
    reply whose counts and usage agree with its request; raises :class:`GenerationError` where they do not."""
    served, usage = reply.ids, reply.usage
    stopped, plain = False, None
    if mode.ignore_eos and mode.token_ids:
        if len(served) != n:
            raise GenerationError(f"{shape}: {len(served)} token ids delivered for max_tokens={n} with ignore_eos")
        if not usage or usage.get("completion_tokens") != n:
            raise GenerationError(f"{shape}: usage completion_tokens={(usage or {}).get('completion_tokens')} "
                                  f"but {n} token ids delivered")
    else:
        served, stopped, plain = _counted(reply, shape, n, (*ref, prompt_ids), mode, float(cfg["retokenize_tolerance"]))
    if probe.api == "completions" and usage.get("prompt_tokens") != len(prompt_ids):
        raise GenerationError(f"{shape}: usage prompt_tokens={usage.get('prompt_tokens')} for a prompt "
                              f"of {len(prompt_ids)} ids")
    return served, stopped, plain


def _counted(reply: _Reply, shape: str, n: int, ref: tuple[Any, Any, list[int]], mode: ApiMode,
             tolerance: float) -> tuple[list[int], bool, list[int] | None]:
    """(the served ids to score, stopped early at EOS, the tokenizer's own spelling of a text reply where it
    differs, else None) for an engine judged without exact ids or pinned lengths; ``ref`` is (reference
    model, tokenizer, prompt ids) for spelling out text."""
    usage = reply.usage or {}
    done = usage.get("completion_tokens")
    model, tok, prompt_ids = ref
    served = reply.ids if mode.token_ids else align_text(model, tok, prompt_ids, reply.text, n)
    if not isinstance(done, int):
        raise GenerationError(f"{shape}: no usage.completion_tokens")
    if done > n:
        raise GenerationError(f"{shape}: usage completion_tokens={done} for max_tokens={n}")
    stopped = not mode.ignore_eos and reply.finish == "stop" and done < n
    # The server bills the EOS it stopped at; the text carries none.
    billed = done - 1 if stopped and not mode.token_ids else done
    # Text has no one true split: the spelling that follows the reference, or the tokenizer's own.
    # An honest bf16 server's 32 tokens spelled 37 the reference's way (it picks tokens the float32
    # reference would not); a server that lies about its count is off by as much both ways.
    plain = None if mode.token_ids else list(tok.encode(reply.text, add_special_tokens=False))
    counts = [len(served)] if plain is None else [len(served), len(plain)]
    if not any(mode.agree(c, billed, tolerance) for c in counts):
        raise GenerationError(f"{shape}: usage completion_tokens={done} but the client counted "
                              f"{' or '.join(map(str, counts))} ({mode.describe()['counts']})")
    if not stopped and not any(mode.agree(c, n, tolerance) for c in counts):
        raise GenerationError(f"{shape}: {len(served)} tokens for max_tokens={n}, finish_reason {reply.finish!r}")
    return served[:n], stopped, (plain[:n] if plain is not None and plain[:n] != served[:n] else None)


def summarize_generation(records: Sequence[Mapping[str, Any]], n: int) -> dict[str, float]:
    """Metrics over all prompts; the rates that can hide in one phase are the worse of the two phases.

    A batching bug touches only the concurrent phase and a cache only the sequential one; averaging
    over both would halve their signal.
    """
    groups = [[r for r in records if r["concurrent"] == c] for c in (True, False)]
    groups = [g for g in groups if g] or [list(records)]

    def tokens(r: Mapping[str, Any]) -> int:  # n, unless an engine without ignore_eos stopped early
        return int(r.get("tokens", n))

    def offtop(rs: Sequence[Mapping[str, Any]]) -> float:
        return sum(r["offtop"] for r in rs) / sum(tokens(r) for r in rs)

    def excess(rs: Sequence[Mapping[str, Any]]) -> float:
        return sum(r["nll"] - r["nll_ref"] for r in rs) / len(rs)

    def short(rs: Sequence[Mapping[str, Any]]) -> float:
        return 1.0 - sum(r["prefix"] for r in rs) / (len(rs) * n)

    return {
        "gen_prompts": float(len(records)),
        "gen_offtop_rate": max(offtop(g) for g in groups),
        "gen_offtop_worst": max(r["offtop"] / tokens(r) for r in records),
        "gen_nll_excess": max(excess(g) for g in groups),
        "gen_nll_excess_worst": max(r["nll"] - r["nll_ref"] for r in records),
        "gen_prefix_short": max(short(g) for g in groups),
    }
