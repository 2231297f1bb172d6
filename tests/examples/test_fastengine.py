"""The fast engine's forward passes agree with transformers' own (tiny model, CPU, float32).

The same code runs on the GPU (benchmarks/gpu/check_engine.py repeats these checks there,
CUDA graphs included); here it proves the arithmetic: RoPE, GQA, the KV pool, chunked prefill,
slot moves and padded decode rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hfserve"))
from fastengine import FastModel, GraphDecoder  # noqa: E402


@pytest.fixture(scope="module")
def models(tiny_model: Path):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    mine = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        fm = FastModel(mine, slots=4, capacity=300)
    return ref, fm


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(4, 2000, (n,), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_prefill_matches_transformers(models) -> None:
    ref, fm = models
    ids = _ids(40, 0)
    want = ref(ids[None]).logits[0]
    got = fm.prefill(ids, 0, 0, all_logits=True)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    # Chunked prefill (cache from earlier chunks + lower-right causal mask) gives the same logits.
    parts = [fm.prefill(ids[s:s + 7], 1, s, all_logits=True) for s in range(0, 40, 7)]
    assert torch.allclose(torch.cat(parts), want, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_batched_decode_matches_transformers(models) -> None:
    ref, fm = models
    dec = GraphDecoder(fm, max_batch=3, use_graphs=False)
    prompts = [_ids(n, 10 + n) for n in (5, 23, 11)]
    for slot, p in enumerate(prompts):
        fm.prefill(p[:-1], slot, 0)
    # Teacher-forced: feed each prompt's last token; the padded bucket (4 > 3) must not disturb.
    logits, greedy = dec.step([int(p[-1]) for p in prompts], [len(p) - 1 for p in prompts])
    for i, p in enumerate(prompts):
        want = ref(p[None]).logits[0, -1]
        assert torch.allclose(logits[i], want, atol=1e-4, rtol=1e-4), (i, (logits[i] - want).abs().max())
        assert greedy[i] == int(torch.argmax(want))
    # Moving sequence 2 into slot 0 keeps its cache: decode it alone from there.
    fm.move_slot(2, 0, len(prompts[2]))
    nxt = _ids(1, 99)
    full = torch.cat([prompts[2], nxt])
    logits, _ = dec.step([int(nxt[0])], [len(prompts[2])])
    assert torch.allclose(logits[0], ref(full[None]).logits[0, -1], atol=1e-4, rtol=1e-4)
