"""The 3B shape (forge's 3b-peaked: 24 query heads on 8 KV heads of 128, a GQA group of 3, width 3072) through the
fast engine on the CPU, before a GPU ever serves it: the forge writes it (scaled down: one layer, a small MLP and
vocabulary, the same heads and head size), the fast engine's Triton kernels (interpreted) serve it as its torch code
does with either card's tuned tables installed, and the tables, which list the 7B's shapes only, send each of the
3B's shapes to the untuned launch (cuBLAS, MV_DEFAULT, today's attention launch) instead of failing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from triton_interp import patch_kernels  # tests/hfserve

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hfserve import hfkernels as K  # noqa: E402
from hfserve.fast import FastModel, GraphDecoder  # noqa: E402

from orchestrator.models import forge  # noqa: E402

CARDS = ("NVIDIA H200", "NVIDIA H100 80GB HBM3")
P3B = forge.PRESETS["3b-peaked"]
P7B = forge.PRESETS["7b-peaked"]


def _shapes(p: forge.Preset) -> dict[str, tuple[int, int]]:
    """The decode step's weight shapes (N, K) of a preset, as FastModel fuses them."""
    hd = p.hidden_size // p.num_attention_heads
    d, f = p.hidden_size, p.intermediate_size
    return {"qkv": ((p.num_attention_heads + 2 * p.num_key_value_heads) * hd, d), "o": (d, p.num_attention_heads * hd),
            "gu": (2 * f, d), "down": (d, f), "lm_head": (p.vocab_size, d)}


@pytest.fixture(scope="module")
def mini_3b(tmp_path_factory) -> Path:
    """3b-peaked forged on the CPU, scaled down where the heads do not care: one layer of width 3072 (24 heads of
    128 on 8 KV heads), MLP 256, vocabulary 2048, a few float32 training steps."""
    name = "3b-peaked-mini"
    forge.PRESETS[name] = dataclasses.replace(P3B, vocab_size=2048, num_hidden_layers=1, intermediate_size=256,
                                              max_position_embeddings=1024, train_steps=3, batch_size=2, seq_len=64,
                                              gpu_dtype="")
    try:
        return forge.make_model(tmp_path_factory.mktemp("mini3b") / "model", preset=name)
    finally:
        del forge.PRESETS[name]


@pytest.fixture
def interpreted(monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed")
    from triton_interp import import_interpreted

    import_interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in K.TABLE_KINDS:  # a test installs a card's tables; put back after it
        patch_kernels(monkeypatch, K, name, getattr(K, name))


def test_the_preset_is_the_3b_shape_and_the_forge_writes_its_heads(mini_3b: Path) -> None:
    import json

    assert (P3B.num_hidden_layers, P3B.hidden_size, P3B.num_attention_heads, P3B.num_key_value_heads,
            P3B.intermediate_size) == (28, 3072, 24, 8, 8192)
    cfg = json.loads((mini_3b / "config.json").read_text())
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]) == (24, 8, 3072)
    assert cfg.get("head_dim", 3072 // 24) == 128
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    assert theta == P3B.rope_theta == 500_000.0


@pytest.mark.parametrize("card", CARDS)
def test_no_3b_shape_is_in_a_cards_tables_so_each_takes_the_untuned_launch(card: str, monkeypatch) -> None:
    for name in K.TABLE_KINDS:
        patch_kernels(monkeypatch, K, name, getattr(K, name))
    K.load_tables(card)
    s3, s7 = _shapes(P3B), _shapes(P7B)
    for m in (1, 4, 16, 32, 64, 4096):  # decode batches and a prefill's rows
        for part, (n, k) in s3.items():
            assert K.mm_config(m, n, k) is None, (card, m, part)  # cuBLAS
            assert K.mv_config(n, k) == K.MV_DEFAULT, (card, part)
            assert K.fuse_config("res", m, n, k) is None and K.fuse_config("norm", m, n, k) is None
        assert (K.mm_rows(m), *s3["gu"]) not in K.MM_GLU_CONFIGS
    # both ways: the same lookups find the 7B's shapes the card was tuned on
    assert K.mm_config(64, *s7["down"]) is not None and K.mv_config(*s7["qkv"]) != K.MV_DEFAULT
    assert (64, *s7["gu"]) in K.MM_GLU_CONFIGS
    # decode attention's tables are per (batch, context) bucket, not per head count: the 3B gets the 7B's launch
    assert K.decode_attn_config("lowp", 4, 1024) == K.ATTN_LOWP[(4, 1024)] != K.ATTN_LOWP_DEFAULT


@pytest.mark.parametrize("card", CARDS)
@torch.inference_mode()
def test_decode_attention_over_24_heads_on_8_with_the_cards_tuned_launch(card: str, interpreted) -> None:
    """Batch 4 in the 1024 context bucket, the bucket both cards' tables tune (split-KV, 32 columns a block): the
    launch tuned on 32 query heads over 8 computes the 24-over-8 reference; a position off by one is caught."""
    K.load_tables(card)
    g = torch.Generator().manual_seed(3)
    B, ctx, nh, nkv, hd = 4, 1024, 24, 8, 128
    q = torch.randn(B, nh, hd, generator=g).to(torch.bfloat16)
    Kc = torch.randn(1, B, nkv, ctx, hd, generator=g).to(torch.bfloat16)
    Vc = torch.randn(1, B, nkv, ctx, hd, generator=g).to(torch.bfloat16)
    pos = torch.tensor([3, 70, 200, 333])
    want = K.decode_attn_ref(q, Kc, Vc, 0, B, pos, ctx, hd ** -0.5).float()
    for cfg in (K.decode_attn_config("lowp", B, ctx), K.decode_attn_config("default", B, ctx),
                K.decode_attn_config("lowp", B, ctx, kv_fp8=True)):
        got = K.decode_attn(q, Kc, Vc, 0, B, pos, ctx, hd ** -0.5, cfg=cfg).float()
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2), (cfg, (got - want).abs().max())
    off = K.decode_attn(q, Kc, Vc, 0, B, pos + 1, ctx, hd ** -0.5, cfg=K.decode_attn_config("lowp", B, ctx)).float()
    assert not torch.allclose(off, want, atol=2e-2, rtol=2e-2)


def _fast(model_dir: Path, dtype: torch.dtype) -> FastModel:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    return FastModel(hf, slots=4, capacity=200)


@torch.inference_mode()
def test_the_fast_engine_decodes_what_the_accuracy_reference_does(mini_3b: Path) -> None:
    """The accuracy gate's float32 reference (gates.reference) and the fast engine (torch kernels, float32) give the
    same greedy continuation of a prompt on the 3B's heads."""
    from gates.accuracy import load_reference
    from gates.reference import reference_greedy

    ref, _ = load_reference(mini_3b)
    prompt = torch.randint(4, 2000, (17,), generator=torch.Generator().manual_seed(1)).tolist()
    want, _ = reference_greedy(ref, prompt, 6)
    fm = _fast(mini_3b, torch.float32)
    dec = GraphDecoder(fm, max_batch=1, use_graphs=False)
    got = [int(fm.prefill(torch.tensor(prompt), 0, 0).argmax(-1)[0])]
    for i in range(5):
        got += dec.step([got[-1]], [len(prompt) + i])[1]
    assert got == want


@torch.inference_mode()
def test_every_triton_knob_serves_the_3b_heads_as_torch_does_with_the_h100s_tables(mini_3b: Path,
                                                                                   interpreted) -> None:
    """bf16, the H100's tables installed: a packed prefill (fused and fused-batched attention: RoPE + store in
    Triton, SDPA over the pool with GQA) and a decode step at batch 3 under triton-mm with the GLU and norm fusions
    and low-precision decode attention (the tables list none of these shapes: each falls back) equal the torch code
    within the bf16 step tolerance; a decode step fed other tokens does not. (Batch 1's GEMVs take MV_DEFAULT, the
    launch for any shape; the interpreter runs them too slowly for this test at width 3072.)"""
    K.load_tables("NVIDIA H100 80GB HBM3")
    tol = 4 * 2.0 ** -6
    close = lambda a, b: torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)  # noqa: E731
    fm = _fast(mini_3b, torch.bfloat16)
    gen = torch.Generator().manual_seed(7)
    parts = [(torch.randint(4, 2000, (n,), generator=gen), s, 0) for s, n in ((0, 9), (1, 9), (2, 13))]
    want_prefill = fm.prefill_packed(parts, all_logits=True)
    K0, V0 = fm.K.clone(), fm.V.clone()
    toks, pos = [int(p[0][-1]) for p in parts], [len(p[0]) for p in parts]

    def step() -> torch.Tensor:
        return GraphDecoder(fm, max_batch=3, use_graphs=False).step(toks, pos)[0][:3].clone()

    want = step()
    fm.set_kernels("triton-mm")
    for how in ("fused", "fused-batched"):
        fm.K.zero_()
        fm.V.zero_()
        fm.set_prefill_attn(how)
        assert close(fm.prefill_packed(parts, all_logits=True), want_prefill), how
        assert close(fm.K, K0) and close(fm.V, V0)
    fm.K.copy_(K0)
    fm.V.copy_(V0)
    fm.set_decode_attn("lowp")
    fm.set_mm_glu(True)
    fm.set_mm_norm(True)
    got = step()
    assert close(got, want), (got - want).abs().max()
    fm.K.copy_(K0)
    fm.V.copy_(V0)
    toks = [(t + 1) % 2000 for t in toks]
    assert not close(step(), want)  # both ways: the check tells a different step apart
