"""Turning a text-only reply back into token ids, for an engine that returns no ids.

Re-tokenizing the text with the tokenizer's own merges does not give back the ids a model
generated: a model can generate ``"re"`` + ``"turn"`` where the tokenizer writes ``"return"``,
and the reference then scores a token the server never chose. On `transformers serve` serving
the forged model, plain re-tokenization made an honest float32 server look off-top on 3 prompts
of 12 (gaps up to 6 nats; gen_offtop_rate 0.042, hard limit 0.02).

So the text is spelled out with the reference's help: at each step the reference's most likely
token whose text continues the reply is taken (the next-best only when the best does not fit).
An honest greedy server chose the reference's top token (or a near-tie) at each step, so its
ids come back exactly; a damaged server's text still needs tokens the reference ranks low,
whichever way it is spelled, because it is judged on the same text the server sent.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["align_text"]

_CANDIDATES = 64  # reference candidates tried per step before falling back to plain tokenization
_MAX_PARTIAL = 3  # consecutive tokens that add only part of a UTF-8 character (at most 4 bytes)


def align_text(model: Any, tok: Any, prompt: list[int], text: str, limit: int) -> list[int]:
    """Ids spelling ``text`` after ``prompt``, chosen most-likely-first by the reference ``model``.

    At most ``limit`` ids plus a few (a reply longer than asked stays visible to the count
    checks). Where no candidate fits, the rest of the text is tokenized the plain way."""
    import torch

    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    special = set(getattr(tok, "all_special_ids", []) or [])
    ids: list[int] = []
    shown, partial = "", 0
    with torch.no_grad():
        out = model(torch.tensor([prompt], device=model.device), use_cache=True)
        while shown != text and len(ids) < limit + 8:
            order = torch.argsort(out.logits[0, -1].float(), descending=True)[:_CANDIDATES].tolist()
            pick = None
            for t in order:
                if t in special:
                    continue
                s = tok.decode(ids + [t], skip_special_tokens=True)
                clean = s.rstrip("\ufffd")  # a token holding part of a character decodes to U+FFFD
                if not text.startswith(clean) or len(clean) < len(shown):
                    continue
                if clean == shown and (s == shown or partial >= _MAX_PARTIAL):
                    continue  # no progress at all, or too many partial bytes in a row
                pick, partial = t, (partial + 1 if clean == shown else 0)
                shown = clean
                break
            if pick is None:
                return ids + list(tok(text[len(shown):], add_special_tokens=False)["input_ids"])
            ids.append(pick)
            cache = getattr(out, "cache", None)
            cache = cache if cache is not None else getattr(out, "past_key_values", None)
            out = model(torch.tensor([[pick]], device=model.device), use_cache=True, **{cache_kw: cache})
    return ids
