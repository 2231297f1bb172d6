"""Prompt construction with exact token lengths and controlled prefix sharing.

With a tokenizer, prompts are random token ids drawn (seeded) from the non-special vocabulary
and sent as id lists to /v1/completions, so the server sees exactly ``prompt_tokens`` tokens.
Without one, prompts are built from a word list (~1 token per word) and the actual length is
read back from ``usage.prompt_tokens``.

Every prompt is seeded by the scenario's ``seed`` and, when set, its ``prompt_seed``: the
measurement's own fresh draw (:func:`fresh_seed`), so a measurement never asks what an earlier
launch, trial or round was asked. A shared prefix (``prefix_tokens``, a trace's ``hash_ids``
blocks) is shared by the requests of one measurement, never across measurements.
"""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from .scenarios import Scenario, TraceEntry

# Common short English words: each is a single token in most BPE vocabularies.
_WORDS = (
    "the of and to in is was for on that with as by at from his her he she it they this "
    "are be or an had not but were which have one all their there been has when who more "
    "will would no if out so said what up its about into than them can only other new some "
    "time could these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know"
).split()


_FRESH = 0x5EED
"""Marks a seed with a `prompt_seed` in it: no fresh draw gives the fixed set's generators."""


def fresh_seed() -> int:
    """A new `Scenario.prompt_seed`: 32 random bits from the OS (a server cannot predict them)."""
    return secrets.randbits(32)


def derived_seed(seed: int, *keys: int) -> int:
    """Another prompt seed from `seed` and `keys` (a repeat, a redone attempt): the same keys give the
    same seed, so two measurements handed one seed draw alike on their redos too."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


@dataclass
class Prompt:
    """One request's input: token ids (exact) or text, plus the intended lengths."""

    prompt: list[int] | str
    prompt_tokens: int  # intended length
    output_tokens: int


def load_tokenizer(tokenizer: Any) -> Any:
    """Accept a tokenizer object or a path to a tokenizer directory (loaded lazily, cached)."""
    if tokenizer is None or not isinstance(tokenizer, str | bytes) and not hasattr(tokenizer, "__fspath__"):
        return tokenizer
    return _load_path(os.fsdecode(tokenizer))


@functools.lru_cache(maxsize=4)
def _load_path(path: str) -> Any:
    # One load per path per process: the controller runs several scenarios per trial.
    from transformers import AutoTokenizer  # lazy: heavy import, optional dependency

    return AutoTokenizer.from_pretrained(path)


def _allowed_ids(tokenizer: Any) -> np.ndarray:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = len(tokenizer)
    return np.array([i for i in range(vocab) if i not in special], dtype=np.int64)


class PromptFactory:
    """Deterministic prompt source for one scenario (seeded by `seed` and `prompt_seed`, prefix shared across requests)."""

    def __init__(self, scenario: Scenario, tokenizer: Any = None, *, text: bool = False) -> None:
        self.scenario = scenario
        self.tokenizer = tokenizer
        self.text = text  # chat API needs strings even when a tokenizer is present
        # The fixed set (no prompt_seed) keeps its generators: [seed] as it always was.
        self.key = [scenario.seed] if scenario.prompt_seed is None else [scenario.seed, _FRESH, scenario.prompt_seed]
        self.rng = np.random.default_rng(scenario.seed if scenario.prompt_seed is None else self.key)
        self.ids = _allowed_ids(tokenizer) if tokenizer is not None else None
        self.prefix = self._draw(scenario.prefix_tokens)
        self._blocks: dict[int, list] = {}

    def _draw(self, n: int, rng: np.random.Generator | None = None) -> list:
        rng = rng or self.rng
        if n <= 0:
            return []
        if self.ids is not None:
            return [int(x) for x in rng.choice(self.ids, size=n)]
        return [str(x) for x in rng.choice(_WORDS, size=n)]

    def _finish(self, toks: list, output_tokens: int) -> Prompt:
        n = len(toks)
        if self.ids is None:
            return Prompt(" ".join(toks), n, output_tokens)
        if not self.text:
            return Prompt(toks, n, output_tokens)
        # Text for the chat API: decode, then trim/pad until re-encoding gives n tokens
        # (the vLLM random-dataset approach). The chat template still adds its own tokens.
        txt = self.tokenizer.decode(toks)
        for _ in range(10):
            enc = self.tokenizer.encode(txt, add_special_tokens=False)
            if len(enc) == n:
                break
            enc = enc[:n] if len(enc) > n else enc + toks[: n - len(enc)]
            txt = self.tokenizer.decode(enc)
        return Prompt(txt, n, output_tokens)

    def make(self, index: int, *, warmup: bool = False) -> Prompt:
        """Prompt ``index``; warmup prompts come from a separate stream so they prime no cache."""
        sc = self.scenario
        rng = np.random.default_rng([*self.key, 1 if warmup else 0, index])
        n_unique = max(0, sc.prompt_tokens - len(self.prefix))
        toks = (list(self.prefix) if not warmup else []) + self._draw(
            n_unique if not warmup else sc.prompt_tokens, rng)
        return self._finish(toks[: sc.prompt_tokens], sc.output_tokens)

    def from_trace(self, entry: TraceEntry) -> Prompt:
        """Mooncake trace: equal hash_ids share identical token blocks, giving real prefix reuse."""
        bs = self.scenario.trace_block_tokens
        toks: list = []
        for h in entry.hash_ids:
            if h not in self._blocks:
                self._blocks[h] = self._draw(bs, np.random.default_rng([*self.key, 7, h]))
            toks.extend(self._blocks[h])
        if len(toks) < entry.input_length:
            toks.extend(self._draw(entry.input_length - len(toks)))
        return self._finish(toks[: entry.input_length], entry.output_length)
