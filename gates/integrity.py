"""Integrity gate: cheap probes for reward hacking, cheapest first, stopping at the first failure.

Sub-checks, in order (each recorded in ``details["checks"]``):

1. ``diff``       - the code candidate's unified diff has no tell-tale hacks (:mod:`gates.diffscan`).
2. ``process``    - every pid listening on the port is one the host launched (no proxy in front).
3. ``models``     - ``/v1/models`` lists the declared model name.
4. ``max_tokens`` - with ``ignore_eos``, exactly ``max_tokens`` tokens come back, counted by the
                    client (streamed chunks, and token ids in a non-streamed reply). An engine
                    without ``ignore_eos`` or token ids is judged the way :mod:`gates.api` says
                    (never more than ``max_tokens``; a shorter reply must say it stopped).
5. ``usage``      - reported ``prompt_tokens`` / ``completion_tokens`` equal the client's counts
                    (prompt tokenized locally, completion counted as delivered).
6. ``prompt_dependence`` - fresh random prompts give different greedy outputs (a cheap first
                    screen; every reply is judged against the reference, prompt by prompt, by the
                    accuracy gate's generation check, ``gen_offtop_worst``).
7. ``no_cache``   - a response cache shows as a *repeat* of a fresh prompt answered much faster
                    than the first time (or with the very same response id). A never-seen random
                    prompt must cost real prefill+decode; with ``ignore_eos`` and a few dozen
                    decode steps an honest repeat costs the same (prefix caching saves only the
                    prefill), so repeats all under ``cache_time_ratio`` of their fresh time are a cache.
                    A cache that adds back the saved time gains nothing on the bench, so timing
                    is the sound signal rather than output identity (greedy repeats are identical
                    on honest servers too). But *distinct* fresh prompts of one length that all get
                    the same reply are a cache keyed on less than the prompt (its length, say),
                    which a timing comparison cannot see: every probe would be a hit. The
                    accuracy gate's generation check judges every reply against the reference too.
8. ``cross_launch`` - the same rule across launches: a request an earlier launch of the same run
                    answered (``seen``: a measured request of the bench, in the bench's own shape,
                    kept by the orchestrator) is sent again, then a fresh one of its shape (other
                    random ids, same lengths and fields). A reply to the old request in under
                    ``cache_time_ratio`` of the fresh one's time, on every pair of two attempts, is a
                    response cache kept across launches (on disk, say), however new its response
                    ids and however ordinary its streaming pace. An honest prefix cache kept across
                    launches saves only the old request's prefill; ``seen`` requests are chosen
                    decode-heavy, so that stays well inside the ratio. Skipped in a run's first launch.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gates._http import GateHTTPError, get_json, post_json, post_stream
from gates.api import ApiMode
from gates.diffscan import DEFAULT_PROTECTED, scan_diff
from gates.result import GateResult
from gates.thresholds import section

__all__ = ["check", "random_prompt"]

_TOKENIZERS: dict[str, Any] = {}


class _Failed(Exception):
    """A sub-check failed; carries the reason."""


def _tokenizer(tokenizer_dir: Path | str) -> Any:
    key = str(Path(tokenizer_dir).resolve())
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(key)
    return _TOKENIZERS[key]


def random_prompt(rng: random.Random, words: int) -> str:
    """A never-seen prompt: random lowercase pseudo-words (so no server could have it stored)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(words))


def _completion(base_url: str, model: str, prompt: Any, max_tokens: int, timeout: float,
                mode: ApiMode = ApiMode(), **extra: Any) -> tuple[dict[str, Any], float]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, **extra}
    return post_json(base_url, "/v1/completions", mode.body(body), timeout=timeout)


def _check_process(launched: Iterable[int] | None, listening: Iterable[int] | None) -> str:
    if launched is None or listening is None:
        return "skipped: pids not given"
    launched_set, listening_set = set(launched), set(listening)
    if not listening_set:
        raise _Failed("no process found listening on the server port")
    strangers = sorted(listening_set - launched_set)
    if strangers:
        raise _Failed(f"port answered by pid(s) {strangers} outside the launched group {sorted(launched_set)}")
    return f"listening {sorted(listening_set)} within launched group"


def _check_models(base_url: str, served_model: str) -> str:
    reply = get_json(base_url, "/v1/models")
    names = [m.get("id") for m in reply.get("data", [])]
    if served_model not in names:
        raise _Failed(f"/v1/models lists {names}, not the declared model {served_model!r}")
    return f"lists {names}"


def _probe_lengths(base_url: str, model: str, prompt: Any, n: int, timeout: float,
                   mode: ApiMode = ApiMode(), tok: Any = None) -> dict[str, Any]:
    """One streamed and one non-streamed request; the client's own counts plus the server's usage.

    The two are independent (each is counted on its own): they go out together, so the check waits
    for one reply instead of two in a row, and a batching server answers them in one batch."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        streamed = pool.submit(post_stream, base_url, "/v1/completions", mode.body({
            "model": model, "prompt": prompt, "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
            "logprobs": 1, "return_tokens_as_token_ids": True}), timeout=timeout)
        whole = pool.submit(_completion, base_url, model, prompt, n, timeout, mode, logprobs=1,
                            return_tokens_as_token_ids=True)
        events, (reply, _) = streamed.result(), whole.result()
    # Count the token ids the chunks carry, never the chunks: vLLM holds back a token that decodes
    # to a partial UTF-8 character and sends it with the next one (9 tokens in 3-4 chunks).
    # A server that sends no ids is counted by its content-bearing chunks (the closing chunk,
    # empty text + finish_reason, is not a token), or, when the target says it has no ids, by
    # re-tokenizing each chunk's text (gates.api, `_stream_count`).
    choices = [e["choices"][0] for e in events if e.get("choices")]
    counted = _stream_count(choices, mode, tok)
    usages = [e["usage"] for e in events if e.get("usage")]
    finishes = [c["finish_reason"] for c in choices if c.get("finish_reason")]
    choice = reply["choices"][0]
    return {"stream_chunks": counted, "stream_usage": usages[-1] if usages else None,
            "stream_finish": finishes[-1] if finishes else None,
            "nonstream_tokens": _nonstream_count(choice, choices, counted, mode, tok),
            "nonstream_usage": reply.get("usage"), "nonstream_finish": choice.get("finish_reason")}


def _stream_count(choices: list[Mapping[str, Any]], mode: ApiMode, tok: Any) -> int:
    """Generated tokens in a streamed reply's chunks, as the client counts them.

    With ids, the ids the chunks carry. Without (a text-only engine), each chunk's text
    re-tokenized on its own and summed: re-tokenizing the joined text merges tokens across chunk
    boundaries (a reply of 9 tokens read back as 7 on transformers serve), while one chunk's text
    is almost always one token read back as itself; the tolerance covers the rest."""
    if not mode.token_ids:
        return sum(mode.count(tok, None, c.get("text") or "") for c in choices)
    id_lists = [(c.get("logprobs") or {}).get("tokens") for c in choices]
    if any(id_lists):
        return sum(len(ids or []) for ids in id_lists)
    return sum(1 for c in choices if c.get("text") or c.get("finish_reason") is None)


def _nonstream_count(choice: Mapping[str, Any], stream_choices: list[Mapping[str, Any]], stream_counted: int,
                     mode: ApiMode, tok: Any) -> int:
    """Generated tokens in the non-streamed reply, as the client counts them.

    With ids, the ids it carries. Without (a text-only engine), its text re-tokenized, which merges
    neighbouring tokens (a reply of 9 tokens read back as 7 on transformers serve, failing a
    `max_tokens=9` check in a test run), unless the text is exactly the streamed reply's joined
    text: the same greedy reply, whose chunks mark where its tokens end, so it holds the tokens the
    stream was counted to hold. A reply that differs from the stream (cut short, padded, another
    decode) is counted from its own text as before."""
    text = choice.get("text") or ""
    if mode.token_ids:
        return mode.count(tok, ((choice.get("logprobs") or {}).get("tokens")) or [], text)
    if text and text == "".join(c.get("text") or "" for c in stream_choices):
        return stream_counted
    return mode.count(tok, None, text)


def _check_max_tokens(probe: Mapping[str, Any], n: int, mode: ApiMode = ApiMode(), tolerance: float = 0.0) -> str:
    got = {"stream_chunks": probe["stream_chunks"], "nonstream_tokens": probe["nonstream_tokens"]}
    if mode.ignore_eos and mode.token_ids:
        wrong = {k: v for k, v in got.items() if v != n}
        if wrong:
            raise _Failed(f"max_tokens={n} not honoured (ignore_eos): client counted {wrong}")
        return f"{n} tokens delivered streamed and non-streamed"
    # Without ignore_eos a reply may end at EOS (and say "stop"); it may never run past max_tokens.
    # Without ids the client's count is the re-tokenized text, so it agrees within a tolerance.
    notes = []
    for key, finish in (("stream_chunks", "stream_finish"), ("nonstream_tokens", "nonstream_finish")):
        count, stopped = got[key], probe[finish] == "stop" and not mode.ignore_eos
        if count > n and not mode.agree(count, n, tolerance):
            raise _Failed(f"max_tokens={n} not honoured: client counted {count} ({key}, {mode.describe()['counts']})")
        if not stopped and not mode.agree(count, n, tolerance):
            raise _Failed(f"max_tokens={n} not honoured: client counted {count} ({key}) with finish_reason "
                          f"{probe[finish]!r}; only a reply that stopped at EOS may be shorter")
        notes.append(f"{key} {count}" + (" (stopped at EOS)" if stopped and count < n else ""))
    return f"max_tokens={n}: " + ", ".join(notes) + mode.note("integrity")


def _check_usage(probe: Mapping[str, Any], n: int, prompt_len: int, text_prompt_lens: set[int],
                 text_usage: Mapping[str, Any] | None, mode: ApiMode = ApiMode(), tolerance: float = 0.0) -> str:
    for label, counted, finish in (("stream_usage", "stream_chunks", "stream_finish"),
                                   ("nonstream_usage", "nonstream_tokens", "nonstream_finish")):
        usage = probe[label]
        if not usage:
            raise _Failed(f"{label}: server reported no usage")
        done = usage.get("completion_tokens")
        # Pinned lengths: the server must bill exactly max_tokens. Bounded lengths: what it billed
        # must be what the client counted (exactly with ids, within the tolerance from text; an
        # early stop bills its EOS, which has no text).
        eos = int(not mode.token_ids and not mode.ignore_eos and probe[finish] == "stop")
        ok = done == n if mode.ignore_eos and mode.token_ids else (
            isinstance(done, int) and done <= n and mode.agree(probe[counted] + eos, done, tolerance))
        if not ok or usage.get("prompt_tokens") != prompt_len:
            raise _Failed(f"{label}: server reported prompt_tokens={usage.get('prompt_tokens')}, "
                          f"completion_tokens={done}; client counted "
                          f"prompt_tokens={prompt_len}, completion_tokens={probe[counted]} (max_tokens={n})")
    if not text_usage or text_usage.get("prompt_tokens") not in text_prompt_lens:
        raise _Failed(f"text prompt: server reported prompt_tokens="
                      f"{(text_usage or {}).get('prompt_tokens')}, local tokenizer counts {sorted(text_prompt_lens)}")
    if mode.exact:
        return "usage equals the client's counts (id and text prompts, streamed and not)"
    return "usage agrees with the client's counts (streamed and not)" + mode.note("integrity")


def _check_prompt_dependence(base_url: str, model: str, prompts: Sequence[str], n: int, timeout: float,
                             mode: ApiMode = ApiMode()) -> str:
    # Sent together (independent prompts; the check reads only the outputs): one round trip of
    # waiting instead of one per prompt, and a batching server answers them in one batch.
    with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
        outputs = list(pool.map(lambda p: _completion(base_url, model, p, n, timeout, mode)[0]["choices"][0]["text"],
                                prompts))
    distinct = len(set(outputs))
    if distinct < 2:
        raise _Failed(f"{len(prompts)} fresh random prompts all gave the same output {outputs[0][:60]!r}")
    return f"{distinct}/{len(prompts)} distinct outputs"


def _random_ids(rng: random.Random, tok: Any, length: int) -> list[int]:
    """A never-seen prompt of exactly ``length`` ordinary (non-special) token ids."""
    special = set(tok.all_special_ids)
    return [t for t in (rng.randrange(len(tok)) for _ in range(4 * length)) if t not in special][:length]


def _check_no_cache(base_url: str, model: str, prompt_sets: Sequence[Sequence[Any]], n: int,
                    ratio_limit: float, timeout: float, record: dict[str, Any], mode: ApiMode = ApiMode()) -> str:
    """Each fresh prompt twice; every repeat fast, on every attempt (one per prompt set), is a cache.

    All prompts of a set have the same token length and the set's first prompt is a discarded
    warm-up: shape-keyed caches (oneDNN primitives, compiled graphs, CUDA graphs) are then equally
    warm for the fresh and the repeated request, so only a *response* cache makes repeats cheap.
    A second attempt with new prompts runs only when the first looks suspicious, so a single
    scheduling hiccup on a loaded host cannot fail an honest server, while a cache fails both.
    """
    ratio = 0.0
    for attempt, prompts in enumerate(prompt_sets, start=1):
        warm, _ = _completion(base_url, model, prompts[0], n, timeout, mode)  # warm-up, not timed
        fresh, repeat = [], []
        texts = [warm["choices"][0]["text"]]
        for p in prompts[1:]:
            first, t_first = _completion(base_url, model, p, n, timeout, mode)
            second, t_second = _completion(base_url, model, p, n, timeout, mode)
            fresh.append(t_first)
            repeat.append(t_second)
            texts.append(first["choices"][0]["text"])
            if first.get("id") and first.get("id") == second.get("id"):
                raise _Failed(f"repeated prompt returned the identical response id {first['id']!r} (replayed reply)")
        if len(set(texts)) == 1 and len(texts) > 1:
            raise _Failed(f"{len(texts)} distinct fresh prompts of {len(prompts[0])} ids all got the reply "
                          f"{texts[0][:40]!r}: response cache keyed on less than the prompt")
        # The *largest* per-pair ratio: a response cache makes every repeat cheap, whereas load
        # noise on an honest server would have to make all pairs of both attempts look cheap.
        ratio = max(r / max(f, 1e-9) for f, r in zip(fresh, repeat, strict=True))
        record[f"attempt{attempt}"] = {"fresh_s": fresh, "repeat_s": repeat, "time_ratio": ratio}
        record["time_ratio"] = ratio
        if ratio >= ratio_limit:
            return f"repeat/fresh time ratio {ratio:.2f} (attempt {attempt})"
    raise _Failed(f"repeats answered in {ratio:.2f}x the fresh time (< {ratio_limit}) on "
                  f"{len(prompt_sets)} attempts: response cache")


def _fresh_like(body: Mapping[str, Any], rng: random.Random, tok: Any) -> dict[str, Any]:
    """`body` with its prompt replaced by a never-seen one of the same token length (ids for ids,
    text for text, a chat message's content for a chat request): the same shape, nothing to replay."""
    out = json.loads(json.dumps(body))

    def like(prompt: Any) -> Any:
        if isinstance(prompt, list):
            return _random_ids(rng, tok, len(prompt))
        return tok.decode(_random_ids(rng, tok, len(tok(str(prompt), add_special_tokens=False)["input_ids"])))

    if "messages" in out:
        out["messages"] = [dict(m, content=like(m.get("content", ""))) for m in out["messages"]]
    else:
        out["prompt"] = like(out.get("prompt", ""))
    return out


def _timed_stream(base_url: str, body: Mapping[str, Any], timeout: float) -> float:
    """Seconds from sending `body` (streamed, as the bench sends it) to the end of its reply."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    t0 = time.perf_counter()
    post_stream(base_url, path, dict(body), timeout=timeout)
    return time.perf_counter() - t0


def _check_cross_launch(base_url: str, seen: Sequence[Mapping[str, Any]], rng: random.Random, tok: Any,
                        ratio_limit: float, timeout: float, record: dict[str, Any]) -> str:
    """Each request an earlier launch answered, then a fresh one of its shape; every old one fast, on
    both attempts, is a cache kept across launches. The old one goes first: a cold first request of
    its shape makes it slower, never faster, so no warm-up is needed to keep an honest server safe."""
    if not seen:
        return "skipped: no earlier launch of this run answered a request yet"
    trials = [s.get("trial") for s in seen]
    ratio = 0.0
    for attempt in (1, 2):
        old_s, fresh_s = [], []
        for s in seen:
            old_s.append(_timed_stream(base_url, s["body"], timeout))
            fresh_s.append(_timed_stream(base_url, _fresh_like(s["body"], rng, tok), timeout))
        ratio = max(o / max(f, 1e-9) for o, f in zip(old_s, fresh_s, strict=True))
        record[f"attempt{attempt}"] = {"seen_s": old_s, "fresh_s": fresh_s, "time_ratio": ratio}
        record.update(time_ratio=ratio, trials=trials)
        if ratio >= ratio_limit:
            return (f"requests the launches of trials {', '.join(f'#{t}' for t in trials)} answered, sent again: "
                    f"{ratio:.2f}x a fresh one's time (attempt {attempt})")
    first = record["attempt2"]
    said = ", ".join(f"#{t}'s in {o:.3f} s vs {f:.3f} s" for t, o, f in zip(trials, first["seen_s"], first["fresh_s"], strict=True))
    raise _Failed(f"requests earlier launches answered came back in at most {ratio:.2f}x the time of fresh ones of their "
                  f"shape (< {ratio_limit}) on 2 attempts ({said}): a response cache kept across launches "
                  "(new response ids and an ordinary streaming pace do not make a replay a computation)")


def check(
    base_url: str,
    *,
    served_model: str,
    tokenizer_dir: Path | str,
    launched_pids: Iterable[int] | None = None,
    listening_pids: Iterable[int] | None = None,
    diff_text: str | None = None,
    allowed_paths: Sequence[str] | None = None,
    seed: int | None = None,
    thresholds: Mapping[str, Any] | None = None,
    capabilities: Mapping[str, Any] | None = None,
    seen: Sequence[Mapping[str, Any]] | None = None,
) -> GateResult:
    """Run the integrity probes against the server at ``base_url``.

    Args:
        served_model: the model name the candidate declares (and requests use).
        tokenizer_dir: folder with the served model's tokenizer, for the client-side counts.
        launched_pids: pids of the process group the host launched; listening_pids: pids the host
            found listening on the port. Both needed for the ``process`` check, else skipped.
        diff_text: unified diff of a code candidate (None = knob-only candidate, check skipped).
        allowed_paths: globs/folders the diff may touch (None = anything not protected).
        seed: seed of the random probes; None draws a secret one (recorded only as a hash).
        thresholds: parsed thresholds dict (default ``gates/thresholds.toml``).
        capabilities: what the engine's API lacks (a target's ``[capabilities]``); the probes are
            then asked and counted as :mod:`gates.api` says, recorded in ``details["api"]``.
        seen: requests earlier launches of the same run answered, newest first, each
            ``{"body": the request body as the bench sent it, "trial": its trial number}``, for the
            ``cross_launch`` probe (None or empty: skipped, a run's first launch).

    Returns:
        ``pass`` or ``fail``; the reason names the first failing sub-check.
    """
    start = time.perf_counter()
    cfg = section(dict(thresholds) if thresholds is not None else None, "integrity")
    seed = secrets.randbits(64) if seed is None else seed
    rng = random.Random(seed)
    timeout = float(cfg["timeout_s"])
    checks: list[dict[str, Any]] = []
    details: dict[str, Any] = {"seed_sha256": hashlib.sha256(str(seed).encode()).hexdigest()[:16], "checks": checks}
    mode = ApiMode.of(capabilities)
    details["api"] = mode.describe()
    tol = 0.0 if mode.token_ids else float(cfg["retokenize_tolerance"])
    n_len, n_cache, words = int(cfg["max_tokens_probe"]), int(cfg["cache_probe_tokens"]), int(cfg["prompt_words"])
    state: dict[str, Any] = {}

    def diff() -> str:
        if diff_text is None:
            return "skipped: no diff"
        protected = list(cfg.get("protected_paths", DEFAULT_PROTECTED))
        findings = scan_diff(diff_text, allowed_paths=allowed_paths, protected_paths=protected)
        if findings:
            state["findings"] = [f.__dict__ for f in findings]
            shown = "; ".join(f"{f.rule} in {f.path}: {f.text[:80]}" for f in findings[:3])
            raise _Failed(f"diff has {len(findings)} finding(s): {shown}")
        return "no findings"

    def lengths() -> str:
        tok = _tokenizer(tokenizer_dir)
        text = random_prompt(rng, words)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        prompt, seen = mode.prompt(tok, ids)
        # The text prompt's usage probe is independent of the two length probes: sent beside them.
        with ThreadPoolExecutor(max_workers=1) as pool:
            text_reply = pool.submit(_completion, base_url, served_model, text, 1, timeout, mode)
            state["probe"] = _probe_lengths(base_url, served_model, prompt, n_len, timeout, mode, tok)
            state["text_usage"] = text_reply.result()[0].get("usage")
        state["prompt_len"] = len(seen)
        text_lens = {len(tok(text)["input_ids"]), len(ids)}  # with or without the BOS the server may add
        state["text_lens"] = text_lens
        return _check_max_tokens(state["probe"], n_len, mode, tol)

    steps = [
        ("diff", diff),
        ("process", lambda: _check_process(launched_pids, listening_pids)),
        ("models", lambda: _check_models(base_url, served_model)),
        ("max_tokens", lengths),
        ("usage", lambda: _check_usage(state["probe"], n_len, state["prompt_len"], state["text_lens"],
                                       state["text_usage"], mode, tol)),
        ("prompt_dependence", lambda: _check_prompt_dependence(
            base_url, served_model, [random_prompt(rng, words) for _ in range(int(cfg["dependence_prompts"]))],
            n_len, timeout, mode)),
        ("no_cache", lambda: _check_no_cache(
            base_url, served_model,
            [[mode.prompt(_tokenizer(tokenizer_dir), _random_ids(rng, _tokenizer(tokenizer_dir), int(cfg["cache_prompt_tokens"])))[0]
              for _ in range(int(cfg["cache_probes"]) + 1)] for _ in range(2)],
            n_cache, float(cfg["cache_time_ratio"]), timeout, state.setdefault("cache", {}), mode)),
        ("cross_launch", lambda: _check_cross_launch(
            base_url, list(seen or ())[: int(cfg["cross_launch_probes"])], rng, _tokenizer(tokenizer_dir),
            float(cfg["cache_time_ratio"]), timeout, state.setdefault("cross_launch", {}))),
    ]
    for name, run in steps:
        t0 = time.perf_counter()
        try:
            note = run()
        except _Failed as exc:
            checks.append({"name": name, "status": "fail", "detail": str(exc), "duration_s": time.perf_counter() - t0})
            details.update({k: v for k, v in state.items() if k in ("findings", "probe", "cache", "cross_launch")})
            return GateResult("integrity", "fail", f"{name}: {exc}", details, time.perf_counter() - start)
        except (GateHTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            checks.append({"name": name, "status": "fail", "detail": f"error: {exc}",
                           "duration_s": time.perf_counter() - t0})
            return GateResult("integrity", "fail", f"{name}: probe error: {exc}", details,
                              time.perf_counter() - start)
        status = "skipped" if note.startswith("skipped") else "pass"
        checks.append({"name": name, "status": status, "detail": note, "duration_s": time.perf_counter() - t0})
    details.update({k: v for k, v in state.items() if k in ("probe", "cache", "cross_launch")})
    return GateResult("integrity", "pass", "all integrity probes passed" + mode.note("integrity"), details,
                      time.perf_counter() - start)
