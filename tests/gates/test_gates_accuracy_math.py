"""The accuracy gate's arithmetic, without servers: coarse KL is exact on S and a lower bound."""

from __future__ import annotations

import random

import pytest
import torch

from gates.accuracy import coarse_kl, draw_windows


def _full_kl(p: torch.Tensor, q: torch.Tensor) -> float:
    return float((p.exp() * (p - q)).sum())


@pytest.mark.parametrize("seed", range(5))
def test_coarse_kl_is_a_lower_bound(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ref = torch.log_softmax(torch.randn(50, generator=g) * 3, -1)
    srv = torch.log_softmax(torch.log_softmax(ref, -1) + torch.randn(50, generator=g) * 0.3, -1)
    top = {int(i): float(srv[i]) for i in torch.topk(srv, 5).indices}
    approx = coarse_kl(ref, top)
    assert 0.0 <= approx <= _full_kl(ref, srv) + 1e-9
    everything = {i: float(srv[i]) for i in range(50)}
    assert coarse_kl(ref, everything) == pytest.approx(_full_kl(ref, srv), abs=1e-6)


def test_coarse_kl_zero_for_identical() -> None:
    ref = torch.log_softmax(torch.randn(30), -1)
    assert coarse_kl(ref, {i: float(ref[i]) for i in range(5)}) == pytest.approx(0.0, abs=1e-9)


def test_windows_depend_only_on_seed() -> None:
    ids = list(range(1000))
    a = draw_windows(ids, random.Random(3), 4, 50)
    assert a == draw_windows(ids, random.Random(3), 4, 50)
    assert a != draw_windows(ids, random.Random(4), 4, 50)
    assert all(len(w) == 50 and w == list(range(w[0], w[0] + 50)) for w in a)
    with pytest.raises(ValueError):
        draw_windows(ids[:10], random.Random(0), 1, 50)
