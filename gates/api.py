"""What the served engine's OpenAI API can do, and how the gates ask and count accordingly.

vLLM, SGLang and hfserve accept ``ignore_eos``, prompts as token-id lists, and
``return_tokens_as_token_ids`` (generated ids in ``logprobs``), and answer ``echo`` with prompt
logprobs; the gates use all four. ``transformers serve`` (5.24) answers the first and third with
HTTP 422 and a token-id prompt with 400, and ignores ``echo``/``logprobs``: it returns text and
``usage`` only (docs/engines.md). A target declares what its engine lacks (``[capabilities]``);
the gates are told and judge another way, naming the way in their reason and ``details["api"]``,
never skipping a check silently:

============== ==========================================================================
missing        how the gates judge instead
============== ==========================================================================
ignore_eos     Lengths are bounded, not pinned: a reply must not exceed ``max_tokens``; one
               that ends sooner must say ``finish_reason: "stop"``, and the accuracy gate
               scores that EOS with the reference like any generated token (an EOS far below
               the reference's top choice fails outright: a server stopping early to look fast).
token_ids      Generated tokens are counted by re-tokenizing the returned text with the
               reference tokenizer; counts must agree within ``retokenize_tolerance`` instead
               of exactly (a detokenize/re-tokenize round trip can merge or split a token).
               The accuracy gate scores the text spelled back into ids with the reference's
               help (:mod:`gates.textalign`), which gives an honest server's ids back exactly.
prompt_ids     Prompts go out as text; the prompt the server saw is that text tokenized by the
               reference tokenizer (with its BOS), and ``usage.prompt_tokens`` must equal it.
echo_logprobs  The accuracy gate judges by its generation check alone: teacher-forced KL,
               containment and perplexity on held-out text are not measured (and say so).
============== ==========================================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ApiMode"]


@dataclass(frozen=True)
class ApiMode:
    """The engine's API capabilities as the gates use them (all True: vLLM-like, judged exactly)."""

    ignore_eos: bool = True
    token_ids: bool = True
    prompt_ids: bool = True
    echo_logprobs: bool = True

    @classmethod
    def of(cls, capabilities: Mapping[str, Any] | None) -> ApiMode:
        """From a target's ``[capabilities]`` (unknown keys ignored, missing ones True)."""
        caps = dict(capabilities or {})
        return cls(**{k: bool(caps.get(k, True)) for k in ("ignore_eos", "token_ids", "prompt_ids", "echo_logprobs")})

    @property
    def exact(self) -> bool:
        """Every check runs its usual, exact way."""
        return self.ignore_eos and self.token_ids and self.prompt_ids and self.echo_logprobs

    def body(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` without the fields this engine refuses (it would answer 422 to all of them)."""
        out = dict(body)
        if not self.ignore_eos:
            out.pop("ignore_eos", None)
        if not self.token_ids:
            for key in ("return_tokens_as_token_ids", "logprobs", "top_logprobs"):
                out.pop(key, None)
        return out

    def prompt(self, tok: Any, ids: list[int]) -> tuple[Any, list[int]]:
        """(what to send as ``prompt``, the ids the server will see) for a prompt of ``ids``.

        Without id prompts the text goes out and the server tokenizes it the usual way (BOS
        included), which the reference tokenizer reproduces."""
        if self.prompt_ids:
            return ids, ids
        text = tok.decode(ids, skip_special_tokens=True)
        return text, list(tok(text)["input_ids"])

    def count(self, tok: Any, ids: list[int] | None, text: str) -> int:
        """Generated tokens as the client counts them: the ids, or the text re-tokenized."""
        if self.token_ids:
            return len(ids or [])
        return len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0

    def agree(self, client: int, server: int, tolerance: float) -> bool:
        """Do the client's and the server's counts agree (exactly with ids; else within tolerance)?"""
        if self.token_ids:
            return client == server
        return abs(client - server) <= max(1, math.ceil(tolerance * max(client, server)))

    def describe(self) -> dict[str, Any]:
        """How the gates judged, for ``details["api"]`` (and, in words, for the reason)."""
        return {
            **asdict(self),
            "lengths": "pinned by ignore_eos" if self.ignore_eos else
                       "bounded by max_tokens; early stops must say finish_reason stop and are scored by the reference",
            "counts": "token ids" if self.token_ids else
                      "returned text: re-tokenized to count, spelled back into ids by the reference to score",
            "prompts": "token ids" if self.prompt_ids else "text, tokenized by the reference tokenizer",
            "accuracy": "teacher-forced logprobs + generation" if self.echo_logprobs else "generation check only",
        }

    def note(self, gate: str = "accuracy") -> str:
        """A few words for ``gate``'s reason; empty when every check ran the exact way."""
        if self.exact:
            return ""
        parts = []
        if not self.echo_logprobs and gate == "accuracy":
            parts.append("generation check only (no echo logprobs)")
        if not self.ignore_eos:
            parts.append("lengths bounded by max_tokens (no ignore_eos)")
        if not self.token_ids:
            parts.append("counts from re-tokenized text (no token ids)")
        if not self.prompt_ids:
            parts.append("text prompts")
        return " (judged as: " + "; ".join(parts) + ")"  # no brackets: rich would read them as markup
