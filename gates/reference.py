"""The float32 reference's side of the generation check and the bench audit: its own greedy
continuations and its teacher-forced score of served continuations, batched and cached.

The reference model is deterministic, so each result is a function of the ids alone and is
cached per (reference model, ids): a prompt seen again is never recomputed. Sequences of one
length go through the model together (no padding, so each row sees exactly its own ids).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["reference_greedy", "reference_greedy_many", "score_many"]

_GREEDY_LOCK = threading.Lock()
# (model id, prompt ids, new tokens) -> (greedy ids, their reference NLL per token). The reference
# model is deterministic, so a prompt seen again (a relaunch judged with the same seed, a chat
# prompt shared by modes) is never recomputed.
_GREEDY_CACHE: dict[tuple[int, tuple[int, ...], int], tuple[list[int], float]] = {}
# (model id, prompt ids, served ids) -> (gaps, NLL per token): the reference's teacher-forced score of
# a continuation is a function of the ids alone. The bench audit scores the bench's own prompts,
# the same in every trial, and honest greedy servers return the same ids for them, so a later
# trial reads the score instead of running the float32 forward again. Bounded (oldest out first).
_SCORE_LOCK = threading.Lock()
_SCORE_CACHE: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[list[float], float]] = {}
_SCORE_CACHE_MAX = 4096
# Sequences per batched reference forward: the reference is memory-bound on a GPU, so a batch of
# equal-length prompts costs about one prompt's time (the 7B's fp32 decode step ~40 ms at batch 1).
_BATCH = 16


def reference_greedy(model: Any, prompt: list[int], n: int) -> tuple[list[int], float]:
    """The reference's own greedy continuation of ``n`` tokens (EOS ignored) and its NLL per token."""
    import torch

    key = (id(model), tuple(prompt), n)
    with _GREEDY_LOCK:
        if key in _GREEDY_CACHE:
            return _GREEDY_CACHE[key]
    cache_kw = _cache_kw(model)
    ids = list(prompt)
    with torch.no_grad():
        out = model(torch.tensor([ids], device=model.device), use_cache=True)
        total = 0.0
        for step in range(n):
            lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            tok = int(torch.argmax(lp))
            total -= float(lp[tok])
            ids.append(tok)
            if step + 1 < n:
                cache = getattr(out, "cache", None)
                cache = cache if cache is not None else getattr(out, "past_key_values", None)
                out = model(torch.tensor([[tok]], device=model.device), use_cache=True, **{cache_kw: cache})
    result = (ids[len(prompt):], total / n)
    with _GREEDY_LOCK:
        _GREEDY_CACHE[key] = result
    return result


def _cache_kw(model: Any) -> str:
    # transformers renamed `past_key_values` to `cache` (5.2x); accept both.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def reference_greedy_many(model: Any, prompts: Sequence[list[int]], n: int) -> list[tuple[list[int], float]]:
    """:func:`reference_greedy` of every prompt, equal-length prompts decoded together as one batch.

    The same greedy rule (argmax, first index on a tie) step by step; no padding, so each row sees
    exactly its own prompt. ``n`` decode steps per batch instead of ``n`` per prompt: on the 7B's
    fp32 reference, 12 prompts x 32 tokens were 384 sequential steps (~15 s) per gate run.
    Results go to the same cache :func:`reference_greedy` reads.
    """
    import torch

    with _GREEDY_LOCK:
        todo = sorted({tuple(p) for p in prompts if (id(model), tuple(p), n) not in _GREEDY_CACHE})
    by_len: dict[int, list[tuple[int, ...]]] = {}
    for p in todo:
        by_len.setdefault(len(p), []).append(p)
    kw = _cache_kw(model)
    for group in by_len.values():
        for at in range(0, len(group), _BATCH):
            batch = group[at:at + _BATCH]
            with torch.no_grad():
                out = model(torch.tensor(batch, device=model.device), use_cache=True)
                total = torch.zeros(len(batch), dtype=torch.float64)
                steps = []
                for step in range(n):
                    lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
                    tok = torch.argmax(lp, dim=-1)
                    total -= lp.gather(-1, tok[:, None])[:, 0].double().cpu()
                    steps.append(tok.cpu())
                    if step + 1 < n:
                        cache = getattr(out, "cache", None)
                        cache = cache if cache is not None else getattr(out, "past_key_values", None)
                        out = model(tok[:, None], use_cache=True, **{kw: cache})
            gen = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in batch]
            with _GREEDY_LOCK:
                for row, p in enumerate(batch):
                    _GREEDY_CACHE[(id(model), p, n)] = (gen[row], float(total[row]) / n)
    return [reference_greedy(model, list(p), n) for p in prompts]


def _score(model: Any, prompt: list[int], served: list[int]) -> tuple[list[float], float]:
    """Teacher-forced on the served tokens: per position the gap to the reference's top-1, and NLL per token."""
    return score_many(model, [(prompt, served)])[0]


def score_many(model: Any, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[list[float], float]]:
    """:func:`_score` of every (prompt, served) pair, in order; pairs of equal prompt and served
    lengths share one batched forward (no padding: each row sees only its own ids), and a pair
    scored before is read from the cache."""
    import torch

    keys = [(id(model), tuple(p), tuple(s)) for p, s in pairs]
    with _SCORE_LOCK:
        done = {k: _SCORE_CACHE[k] for k in keys if k in _SCORE_CACHE}
    todo = sorted(set(keys) - set(done))
    by_shape: dict[tuple[int, int], list[tuple[int, tuple[int, ...], tuple[int, ...]]]] = {}
    for k in todo:
        by_shape.setdefault((len(k[1]), len(k[2])), []).append(k)
    for (plen, _), group in by_shape.items():
        for at in range(0, len(group), _BATCH):
            batch = group[at:at + _BATCH]
            with torch.no_grad():
                logits = model(torch.tensor([list(p) + list(s) for _, p, s in batch], device=model.device)).logits
                rows = torch.log_softmax(logits[:, plen - 1:-1].float().cpu(), dim=-1)
            chosen = rows.gather(-1, torch.tensor([list(s) for _, _, s in batch])[..., None])[..., 0]
            gap = rows.max(dim=-1).values - chosen
            with _SCORE_LOCK:
                for row, k in enumerate(batch):
                    done[k] = (gap[row].tolist(), float(-chosen[row].mean()))
                    while len(_SCORE_CACHE) >= _SCORE_CACHE_MAX:
                        _SCORE_CACHE.pop(next(iter(_SCORE_CACHE)))
                    _SCORE_CACHE[k] = done[k]
    return [done[k] for k in keys]
