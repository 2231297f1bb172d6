"""The gates' reference work done in batches (gates/reference.py, gates/accuracy.py) gives what the
one-at-a-time path gives, and the score cache never lets a different continuation pass (no server)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gates import reference as ref_module
from gates.accuracy import _heldout_ids, _reference_rows, draw_windows, load_reference
from gates.reference import _GREEDY_CACHE, reference_greedy, reference_greedy_many, score_many

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def reference(tiny_model: Path):
    return load_reference(tiny_model)


def _prompts(tok, n: int, length: int, seed: int) -> list[list[int]]:
    return [[tok.bos_token_id, *w] for w in draw_windows(_heldout_ids(tok), random.Random(seed), n, length)]


def test_batched_greedy_is_the_one_at_a_time_greedy(reference) -> None:
    model, tok = reference
    prompts = _prompts(tok, 3, 32, seed=11) + _prompts(tok, 1, 20, seed=12)  # two lengths: two batches
    batched = reference_greedy_many(model, prompts, 8)
    for p in prompts:
        _GREEDY_CACHE.pop((id(model), tuple(p), 8))
    single = [reference_greedy(model, p, 8) for p in prompts]
    assert [g for g, _ in batched] == [g for g, _ in single]
    assert [nll for _, nll in batched] == pytest.approx([nll for _, nll in single], abs=1e-4)


def test_batched_scores_match_and_the_cache_never_passes_another_continuation(reference) -> None:
    model, tok = reference
    prompts = _prompts(tok, 3, 32, seed=21)
    honest = [g for g, _ in reference_greedy_many(model, prompts, 16)]
    rng = random.Random(5)
    forged = [[rng.randrange(len(tok)) for _ in range(16)] for _ in prompts]  # what a broken decode returns
    pairs = list(zip(prompts, honest, strict=True)) + list(zip(prompts, forged, strict=True))
    ref_module._SCORE_CACHE.clear()
    batched = score_many(model, pairs)
    ref_module._SCORE_CACHE.clear()
    one_by_one = [score_many(model, [pair])[0] for pair in pairs]
    for (g1, n1), (g2, n2) in zip(batched, one_by_one, strict=True):
        assert g1 == pytest.approx(g2, abs=1e-4) and n1 == pytest.approx(n2, abs=1e-4)
    # The honest continuation is the reference's own greedy: no token off its top-1.
    assert all(max(g) < 1e-4 for g, _ in batched[:3])
    # With the honest scores cached, the forged continuations of the same prompts are scored afresh
    # and fail as before (random tokens sit nats below the reference's top-1).
    ref_module._SCORE_CACHE.clear()
    score_many(model, pairs[:3])
    again = score_many(model, pairs[3:])
    assert all(sum(x > 0.05 for x in g) >= 12 for g, _ in again)


def test_batched_teacher_forced_rows_are_the_single_window_rows(reference) -> None:
    model, tok = reference
    windows = _prompts(tok, 3, 96, seed=31)
    rows = _reference_rows(model, windows, {}, 0.0)
    for w, r in zip(windows, rows, strict=True):
        with torch.no_grad():
            one = model(torch.tensor([w])).logits[0].float()
        assert torch.allclose(torch.log_softmax(r, -1), torch.log_softmax(one, -1), atol=1e-4)
