"""The fast engine's forward passes agree with transformers' own (tiny model, CPU, float32).

The same code runs on the GPU (benchmarks/gpu/check_engine.py repeats these checks there,
CUDA graphs included); here it proves the arithmetic: RoPE, GQA, the KV pool, chunked prefill,
slot moves and padded decode rows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from triton_interp import patch_kernels, same_rounding  # tests/hfserve

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hfserve.fast import FastModel, GraphDecoder  # noqa: E402


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


# -- kernels="torch" is the code as it was; kernels="triton" agrees with it ------------------------


def _random_llama(dtype: torch.dtype, seed: int = 0):
    """A tiny random Llama (2 layers, 4 q heads over 2 kv heads, head_dim 16), built in memory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False)
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a norm applied to the wrong tensor shows
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.add_(0.2 * torch.randn_like(p))
    return hf.to(dtype)


def _prefill_before(fm: FastModel, ids, slot: int, start: int, all_logits: bool = False):
    """FastModel.prefill as it was before the kernels knob, line for line."""
    from torch.nn.attention.bias import causal_lower_right

    c = ids.shape[0]
    end = start + c
    g = fm.nh // fm.nkv
    x = fm.embed[ids]
    cos, sin = fm.cos[start:end][None, :, None, :], fm.sin[start:end][None, :, None, :]
    mask = causal_lower_right(c, end)
    for li, L in enumerate(fm.layers):
        h = fm._rms(x, L["ln1"])
        q, k, v = fm._split(h @ L["qkv"].t())
        q = q.view(1, c, fm.nh, fm.hd)
        k = k.view(1, c, fm.nkv, fm.hd)
        q = (q * cos + fm._rot(q) * sin).transpose(1, 2)
        k = (k * cos + fm._rot(k) * sin).transpose(1, 2)
        fm.K[li, slot, :, start:end] = k[0]
        fm.V[li, slot, :, start:end] = v.view(c, fm.nkv, fm.hd).transpose(0, 1)
        kc = fm.K[li, slot:slot + 1, :, :end].repeat_interleave(g, dim=1)
        vc = fm.V[li, slot:slot + 1, :, :end].repeat_interleave(g, dim=1)
        with fm._sdpa_ctx():
            o = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=fm.scale)
        x = x + o.transpose(1, 2).reshape(c, fm.nh * fm.hd) @ L["o"].t()
        x = x + fm._mlp(fm._rms(x, L["ln2"]), L)
    x = fm._rms(x if all_logits else x[-1:], fm.norm)
    return (x @ fm.lm_head.t()).float()


def _decode_before(fm: FastModel, tokens, pos, ctx: int):
    """FastModel.decode as it was before the kernels knob, line for line."""
    B = tokens.shape[0]
    g = fm.nh // fm.nkv
    rows = torch.arange(B, device=tokens.device)
    x = fm.embed[tokens]
    cos, sin = fm.cos[pos][:, None, :], fm.sin[pos][:, None, :]
    keep = torch.arange(ctx, device=tokens.device)[None, :] <= pos[:, None]
    bias = torch.zeros(B, ctx, device=tokens.device, dtype=torch.float32).masked_fill(~keep, float("-inf"))
    bias = bias[:, None, None, :]
    for li, L in enumerate(fm.layers):
        h = fm._rms(x, L["ln1"])
        q, k, v = fm._split(h @ L["qkv"].t())
        q = q.view(B, fm.nh, fm.hd)
        k = k.view(B, fm.nkv, fm.hd)
        q = q * cos + fm._rot(q) * sin
        k = k * cos + fm._rot(k) * sin
        fm.K[li, rows, :, pos] = k
        fm.V[li, rows, :, pos] = v.view(B, fm.nkv, fm.hd)
        kc, vc = fm.K[li, :B, :, :ctx], fm.V[li, :B, :, :ctx]
        s = torch.matmul(q.view(B, fm.nkv, g, fm.hd), kc.transpose(-1, -2)).float() * fm.scale
        p = torch.softmax(s + bias, dim=-1).to(fm.dtype)
        o = torch.matmul(p, vc).reshape(B, fm.nh * fm.hd)
        x = x + o @ L["o"].t()
        x = x + fm._mlp(fm._rms(x, L["ln2"]), L)
    logits = (fm._rms(x, fm.norm) @ fm.lm_head.t()).float()
    return logits, torch.argmax(logits, dim=-1)


PROMPTS = [(5, 1), (23, 2), (11, 3)]  # (length, seed) per slot


def _prefilled(dtype: torch.dtype, kernels: str = "torch") -> tuple[FastModel, list[torch.Tensor]]:
    with torch.inference_mode():
        fm = FastModel(_random_llama(dtype), slots=4, capacity=300, kernels=kernels)
        prompts = [torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(s)) for n, s in PROMPTS]
        for slot, p in enumerate(prompts):
            _prefill_before(fm, p[:-1], slot, 0)
    return fm, prompts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_torch_kernels_are_the_code_before(dtype) -> None:
    """kernels="torch" (the default) computes bit for bit what FastModel computed before the knob."""
    fm, prompts = _prefilled(dtype)
    assert fm.kernels == "torch"
    ids = torch.cat(prompts)
    for all_logits in (True, False):
        want = _prefill_before(fm, ids, 3, 0, all_logits)
        K3 = fm.K[:, 3].clone()
        assert torch.equal(fm.prefill(ids, 3, 0, all_logits), want) and torch.equal(fm.K[:, 3], K3)
    assert torch.equal(fm.prefill(ids[20:], 3, 20, True), _prefill_before(fm, ids[20:], 3, 20, True))  # a chunk
    tokens = torch.tensor([int(p[-1]) for p in prompts] + [0])
    pos = torch.tensor([len(p) - 1 for p in prompts] + [fm.scratch_pos])  # a padded row, as GraphDecoder pads
    want, want_ids = _decode_before(fm, tokens, pos, 256)
    got, got_ids = fm.decode(tokens, pos, 256)
    assert torch.equal(got, want) and torch.equal(got_ids, want_ids)


@pytest.fixture
def interpreted(monkeypatch):
    """hfserve.hfkernels' Triton kernels on the CPU (interpreter), for the tests that run kernels="triton"."""
    pytest.importorskip("triton", reason="triton is not installed")
    from triton_interp import import_interpreted  # beside this file

    import_interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# fp32: only summation order differs. bf16: the kernel tests' decode-step tolerance (4 x 2**-6).
STEP_TOL = {torch.float32: 1e-4, torch.bfloat16: 4 * 2.0 ** -6}


def _one_step(fm: FastModel, prompts: list, K0: torch.Tensor, V0: torch.Tensor, kernels: str,
              **settings: str | bool) -> tuple[torch.Tensor, list[int]]:
    """One eager decode step of ``prompts``' last tokens from the pool ``K0``/``V0``, under ``kernels`` and the
    FastModel ``settings`` (decode_attn=..., mm_glu=...: each set_<name>); all put back after. (logits, ids)."""
    b = len(prompts)
    fm.K.copy_(K0)
    fm.V.copy_(V0)
    fm.set_kernels(kernels)
    for name, val in settings.items():
        getattr(fm, f"set_{name}")(val)
    try:
        logits, ids = GraphDecoder(fm, max_batch=b, use_graphs=False).step([int(p[-1]) for p in prompts],
                                                                            [len(p) - 1 for p in prompts])
        return logits[:b].clone(), ids
    finally:
        fm.set_mm_glu(False)
        fm.set_mm_norm(False)
        fm.set_decode_attn("default")
        fm.set_kernels("torch")


def _step_close(dtype: torch.dtype):
    """``close(a, b)``: equal within STEP_TOL[dtype] (relative and absolute), compared in float32."""
    tol = STEP_TOL[dtype]
    return lambda a, b: torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def _torch_step(dtype: torch.dtype):
    """A decode step of three prefilled prompts with kernels="torch" (GraphDecoder, no graphs): the model, the
    prompts, the decoder, the step's tokens and positions, the KV pool before it; the step's logits (3 rows)
    and ids, the KV pool after it."""
    fm, prompts = _prefilled(dtype)
    dec = GraphDecoder(fm, max_batch=3, use_graphs=False)
    toks, pos = [int(p[-1]) for p in prompts], [len(p) - 1 for p in prompts]
    K0, V0 = fm.K.clone(), fm.V.clone()
    want, want_ids = dec.step(toks, pos)
    return fm, prompts, dec, toks, pos, K0, V0, want[:3].clone(), want_ids, fm.K.clone(), fm.V.clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_triton_kernels_equal_torch(dtype, interpreted) -> None:
    """A decode step (batch 3, split-KV attention: 2 splits of the 256 bucket) and a prefill (whole
    and chunked) with kernels="triton" equal kernels="torch"; the check is shown to tell apart logits
    that differ (another token fed). Padded rows: test_kernels' far-position case (the interpreter
    walks a padded row's whole bucket slowly)."""
    tol = STEP_TOL[dtype]
    close = _step_close(dtype)

    fm, prompts, dec, toks, pos, K0, V0, want, want_ids, Kw, Vw = _torch_step(dtype)
    fm.K.copy_(K0)
    fm.V.copy_(V0)
    fm.set_kernels("triton")
    got, got_ids = dec.step(toks, pos)
    assert close(got[:3], want), (got[:3] - want).abs().max()
    if dtype == torch.float32:
        assert got_ids == want_ids
    else:  # a random model's near-ties may flip in bf16: the pick must be a top logit within tolerance
        assert all(float(want[i, t]) >= float(want[i].max()) - 2 * tol for i, t in enumerate(got_ids))
    assert close(fm.K, Kw) and close(fm.V, Vw)  # the KV store
    fm.set_kernels("torch")
    other, _ = dec.step([(t + 1) % 128 for t in toks], pos)
    assert not close(other[:3], want)  # both ways: a different step is caught by the same check
    ids = torch.cat(prompts)[:20]  # short: the interpreter runs one program per row and kernel
    fm.set_kernels("torch")
    want_all, want_last = fm.prefill(ids, 3, 0, True), fm.prefill(ids, 3, 0)
    fm.set_kernels("triton")
    assert close(fm.prefill(ids, 3, 0, True), want_all) and close(fm.prefill(ids, 3, 0), want_last)
    parts = torch.cat([fm.prefill(ids[s:s + 12], 3, s, True) for s in range(0, len(ids), 12)])
    assert close(parts, want_all)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_gemv_kernels_equal_torch(dtype, interpreted, monkeypatch) -> None:
    """kernels="triton-gemv": a decode step through FastModel._decode_gemv (the QKV and gate/up GEMVs
    with norm, RoPE + store and SwiGLU fused in) equals kernels="torch" (logits, the KV pool); the
    same check catches a step whose fused GEMV stores K one position late; above GEMV_MAX_ROWS rows
    the step falls back to the 10-launch path (_decode_fused)."""
    from hfserve import hfkernels as kernels

    close = _step_close(dtype)

    fm, _, dec, toks, pos, K0, V0, want, _, Kw, Vw = _torch_step(dtype)

    def run(kern: str) -> torch.Tensor:
        fm.K.copy_(K0)
        fm.V.copy_(V0)
        fm.set_kernels(kern)
        try:
            return dec.step(toks, pos)[0][:3].clone()
        finally:
            fm.set_kernels("torch")

    calls = []
    monkeypatch.setattr(fm, "_decode_fused", lambda *a: calls.append(1) or FastModel._decode_fused(fm, *a))
    got = run("triton-gemv")
    assert not calls  # batch 3 <= 16: the fused GEMVs, not the 10-launch path
    assert close(got, want), (got - want).abs().max()
    assert close(fm.K, Kw) and close(fm.V, Vw)
    orig = kernels.norm_qkv_rope

    def late(x, d, lnw, eps, w, cos, sin, pos_, K, V, layer):
        return orig(x, d, lnw, eps, w, cos, sin, pos_ + 1, K, V, layer)

    patch_kernels(monkeypatch, kernels, "norm_qkv_rope", late)
    assert not close(run("triton-gemv"), want)  # both ways: the perturbed kernel is caught
    patch_kernels(monkeypatch, kernels, "norm_qkv_rope", orig)
    patch_kernels(monkeypatch, kernels, "GEMV_MAX_ROWS", 2)  # batch 3 > 2: the unfused triton step
    assert close(run("triton-gemv"), want) and calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_mv_kernels_equal_triton(dtype, interpreted, monkeypatch) -> None:
    """kernels="triton-mv": a batch-1 decode step runs its five projections per layer (QKV, O, gate/up,
    down; lm_head once) through kernels.mv_gemv (the Triton GEMV) and equals kernels="triton" (logits
    within the step tolerance, the greedy id, the KV pool); the same check catches the GEMV run one K
    tile short; at batch 2 (> MV_MAX_ROWS) the step is triton's, bit for bit, without a GEMV launch."""
    from hfserve import hfkernels as kernels

    close = _step_close(dtype)

    fm, prompts = _prefilled(dtype)
    K0, V0 = fm.K.clone(), fm.V.clone()

    def run(kern: str, b: int) -> tuple[torch.Tensor, list[int]]:
        return _one_step(fm, prompts[:b], K0, V0, kern)

    want, want_ids = run("triton", 1)
    Kw, Vw = fm.K.clone(), fm.V.clone()
    cfgs, real = [], kernels.mv_gemv
    patch_kernels(monkeypatch, kernels, "mv_gemv", lambda x, w, cfg, **kw: cfgs.append(tuple(w.shape)) or real(x, w, cfg, **kw))
    got, got_ids = run("triton-mv", 1)
    n = len(fm.layers)
    assert len(cfgs) == 4 * n + 1 and cfgs[-1] == tuple(fm.lm_head.shape)  # every projection a GEMV launch
    assert close(got, want), (got - want).abs().max()
    assert got_ids == want_ids
    assert close(fm.K, Kw) and close(fm.V, Vw)  # the K/V rows the QKV GEMV produced
    patch_kernels(monkeypatch, kernels, "mv_gemv", lambda x, w, cfg, **kw: real(x, w, cfg, nt_short=1))
    assert not close(run("triton-mv", 1)[0], want)  # both ways: the GEMV one K tile short is caught
    patch_kernels(monkeypatch, kernels, "mv_gemv", real)
    cfgs.clear()
    want2, _ = run("triton", 2)
    got2, _ = run("triton-mv", 2)
    assert torch.equal(got2, want2) and not cfgs


# -- packed prefill (several prompts, one forward pass) and the fused prefill RoPE + attention -----


def _packed_case(fm: FastModel):
    """Three prompts packed at slots 2, 0, 3 (out of order on purpose), one a continuation chunk."""
    gen = torch.Generator().manual_seed(5)
    a, b, c = (torch.randint(0, 128, (n,), generator=gen) for n in (9, 17, 6))
    fm.prefill(c[:4], 3, 0)  # slot 3 holds 4 tokens already: the packed part continues at position 4
    return [(a, 2, 0), (b, 0, 0), (c[4:], 3, 4)]


@torch.inference_mode()
def test_packed_prefill_equals_one_at_a_time() -> None:
    """prefill_packed over three parts gives each part's last logits and the same KV as three prefill
    calls (float32: only GEMM blocking differs); a part written to the wrong slot is caught."""
    fm = FastModel(_random_llama(torch.float32), slots=4, capacity=300)
    parts = _packed_case(fm)
    want = torch.cat([fm.prefill(ids, slot, start) for ids, slot, start in parts])
    Kw, Vw = fm.K.clone(), fm.V.clone()  # the packed pass rewrites the same positions with the same values
    got = fm.prefill_packed(parts)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    assert torch.allclose(fm.K, Kw, atol=1e-6) and torch.allclose(fm.V, Vw, atol=1e-6)
    all_rows = fm.prefill_packed(parts, all_logits=True)
    assert all_rows.shape[0] == sum(len(p[0]) for p in parts)
    assert torch.allclose(all_rows[[8, 25, 27]], want, atol=1e-5, rtol=1e-5)  # each part's last row
    swapped = [(parts[0][0], 1, 0), parts[1], parts[2]]  # part a into slot 1: its own KV is elsewhere
    bad = fm.prefill_packed([(parts[0][0], 2, 1), parts[1], parts[2]])  # a at position 1: RoPE shifted
    assert not torch.allclose(bad[0], want[0], atol=1e-5, rtol=1e-5)
    assert torch.allclose(fm.prefill_packed(swapped)[0], want[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_fused_prefill_attention_equals_torch(dtype, interpreted, monkeypatch) -> None:
    """prefill_attn="fused" (Triton RoPE + store over every packed row, SDPA with GQA on the pool) equals
    "torch" for a whole prompt, a chunk and a packed set, with rope_store's one-(row, head) programs and
    with its prefill programs of several rows (what a prefill of >= ROPE_ROWS_MIN rows runs); a perturbed
    kernel (positions off by one) fails."""
    from hfserve import hfkernels as kernels

    close = _step_close(dtype)

    fm = FastModel(_random_llama(dtype), slots=4, capacity=300)
    parts = _packed_case(fm)
    want = fm.prefill_packed(parts, all_logits=True)
    Kw = fm.K.clone()
    fm.set_prefill_attn("fused")
    assert close(fm.prefill_packed(parts, all_logits=True), want) and close(fm.K, Kw)
    if dtype == torch.float32:  # the prefill's rows kernel, here on a few rows (bit-equal: one dtype is enough)
        with monkeypatch.context() as m:
            patch_kernels(m, kernels, "ROPE_ROWS_MIN", 1)
            patch_kernels(m, kernels, "ROPE_ROWS", 4)
            assert close(fm.prefill_packed(parts, all_logits=True), want) and close(fm.K, Kw)
    fm.set_kernels("triton")  # with the fused norms and SwiGLU as well
    assert close(fm.prefill_packed(parts, all_logits=True), want)
    fm.set_kernels("torch")
    orig = kernels.rope_store

    def shifted(qkv, cos, sin, pos, K, V, layer, q_out=None, slots=None, rows=None):
        return orig(qkv, cos, sin, pos + 1, K, V, layer, q_out, slots, rows)

    with pytest.MonkeyPatch.context() as mp:
        patch_kernels(mp, kernels, "rope_store", shifted)
        assert not close(fm.prefill_packed(parts, all_logits=True), want)


def _engine_outputs(model_dir: Path, prompts: list[list[int]], sizes: list[int], logprobs: int | None = None,
                    **kw) -> list[list]:
    """Greedy tokens per prompt from a FastEngine on the CPU, every prompt submitted at once (a burst);
    ``sizes`` gets the number of prompts of each prefill forward pass. With ``logprobs`` (k) each
    token is (id, logprob, top k) instead."""
    import asyncio

    from hfserve.engine import GenRequest
    from hfserve.fast import FastEngine

    eng = FastEngine(str(model_dir), dtype="float32", device="cpu", cuda_graphs=False, **kw)
    packed_prefill = eng.fm.prefill_packed

    def counted(parts, all_logits=False):
        sizes.append(len(parts))
        return packed_prefill(parts, all_logits)

    eng.fm.prefill_packed = counted

    async def run() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        reqs = [GenRequest(prompt_ids=p, max_tokens=n, temperature=0.0, top_p=1.0, seed=None, ignore_eos=True,
                           logprobs=logprobs, loop=loop) for p, n in zip(prompts, (6, 1, 9, 4, 7, 3), strict=False)]
        with eng.jobs.not_empty:  # one atomic burst: the worker wakes to all of them queued
            eng.jobs.queue.extend(reqs)
            eng.jobs.unfinished_tasks += len(reqs)
            eng.jobs.not_empty.notify()
        out = []
        for r in reqs:
            toks = []
            while True:
                kind, payload = await asyncio.wait_for(r.events.get(), 60)
                if kind == "token":
                    toks.append(payload.token_id if logprobs is None else (payload.token_id, payload.logprob,
                                                                           payload.top))
                elif kind == "done":
                    break
                else:
                    raise AssertionError(payload)
            out.append(toks)
        return out

    return asyncio.run(run())


def test_packed_burst_gives_the_unbatched_tokens(tiny_model: Path) -> None:
    """A burst of 6 requests (one finishing at its first token) through packed prefill and 4 slots
    decodes greedily to exactly the tokens of one-prompt prefill, and of one request at a time."""
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(4, 2000, (n,), generator=gen).tolist() for n in (12, 30, 7, 21, 16, 9)]
    sizes: dict[str, list[int]] = {k: [] for k in ("alone", "one", "packed", "chunked")}
    alone = _engine_outputs(tiny_model, prompts, sizes["alone"], max_batch_size=1)
    one = _engine_outputs(tiny_model, prompts, sizes["one"], max_batch_size=4)
    packed = _engine_outputs(tiny_model, prompts, sizes["packed"], max_batch_size=4, prefill_pack=64)
    chunked = _engine_outputs(tiny_model, prompts, sizes["chunked"], max_batch_size=4, prefill_pack=64,
                              prefill_chunk=40)
    assert [len(t) for t in alone] == [6, 1, 9, 4, 7, 3]
    assert packed == one == alone and chunked == alone
    # Packing happened: the burst's first pass took 3 prompts (12 + 30 + 7 <= 64 tokens, 4 slots), the
    # next 2 (the 30-token one finished at its first token, freeing a slot); under the 40-token chunk
    # budget some passes still pack while the 30-token prompt goes the chunked one-prompt way.
    assert max(sizes["one"]) == 1 and sizes["packed"][0] == 3 and max(sizes["chunked"]) >= 2, sizes


def test_step_tokens_are_streamed_after_the_next_launch(monkeypatch) -> None:
    """A decode step's events are woken once the *next* step is queued on the device (C's
    served overhead): the event loop's streaming of step k then overlaps step k+1 instead of taking
    the GIL between step k's sync and step k+1's launch. Without a next step they are woken at once,
    and every event still arrives, in order (no model: a fake decoder records the order of things)."""
    import asyncio
    import queue
    import threading
    import time

    from hfserve import engine as engine_mod
    from hfserve.fast import scheduler

    log: list = []

    class Decoder:
        k = 0

        def launch(self, tokens, positions):
            Decoder.k += 1
            log.append(("launch", Decoder.k, len(tokens)))
            return None, torch.tensor([100 + Decoder.k] * len(tokens))

    real_wake = scheduler.wake
    monkeypatch.setattr(scheduler, "wake", lambda reqs: (log.append(("wake", Decoder.k)), real_wake(reqs)))
    eng = scheduler.FastEngine.__new__(scheduler.FastEngine)
    eng.decoder, eng.eos_ids, eng.max_batch, eng.chunk, eng.pack = Decoder(), {2}, 4, 0, 0
    eng.fm = type("FM", (), {"move_slot": lambda *a: None})()
    loop = asyncio.new_event_loop()
    reqs = [engine_mod.GenRequest(prompt_ids=[5], max_tokens=n, temperature=0.0, top_p=1.0, seed=None,
                                  ignore_eos=True, logprobs=None, loop=loop) for n in (3, 5)]
    active = []
    for r in reqs:
        s = scheduler._FSeq(r, None)
        s.last, s.pos, r.n_generated = 7, 1, 1
        active.append(s)
    late: list = []
    while active:
        active, late = eng._decode(active, late)
    # The wake of step k's events comes after step k+1's launch, never before it.
    assert log[:4] == [("launch", 1, 2), ("launch", 2, 2), ("wake", 2), ("launch", 3, 1)]
    assert [e for e in log if e[0] == "launch"][-1] == ("launch", 4, 1) and log[-1] == ("wake", 4)
    assert late == [reqs[1]]  # the last step's events: the worker loop wakes these at once (no next step)

    # The worker loop end to end: all events reach the handlers, the last step's too.
    eng.jobs = queue.Queue()
    eng.fm = type("FM", (), {"move_slot": lambda *a: None, "device": torch.device("cpu")})()

    def first_token(s, row, notify=True):  # the prompt's token: id 101, never the last
        s.req.push("token", 101)
        s.last, s.req.n_generated = 101, 1
        if notify:
            real_wake([s.req])
        return False

    def prefill_some(s, row, budget):
        s.pos, eng._pending_logits = 1, None
        return True, 1

    eng._first_token, eng._prefill_some = first_token, prefill_some
    got: dict[int, list] = {}

    async def handler(i: int, r) -> None:
        got[i] = []
        while True:
            for kind, payload in await r.events.get_batch():
                got[i].append(payload)
                if kind == "done":
                    return

    reqs = [engine_mod.GenRequest(prompt_ids=[5], max_tokens=n, temperature=0.0, top_p=1.0, seed=None,
                                  ignore_eos=True, logprobs=None, loop=loop) for n in (2, 4)]
    threading.Thread(target=eng._loop, daemon=True).start()
    for r in reqs:
        eng.submit(r)
    t0 = time.perf_counter()

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(handler(i, r) for i, r in enumerate(reqs))), 10)

    loop.run_until_complete(main())
    loop.close()
    assert time.perf_counter() - t0 < 10
    assert [len(got[0]), len(got[1])] == [3, 5] and got[0][-1] == got[1][-1] == "length"


class _FakeDecoder:
    """A decode step with no model: the next id of a row is ``(7 * token + position) % 97 + 3``, computed
    when the step is launched (as the device would), read back by ``tolist()``; logs launches and reads."""

    def __init__(self, log: list) -> None:
        self.log, self.k = log, 0

    def launch(self, tokens, positions, prev=None):
        self.k += 1
        src = tokens if tokens is not None else prev.tolist()  # prev: the device ids (no read logged)
        self.log.append(("launch", self.k, len(positions), "host" if tokens is not None else "device"))
        return None, torch.tensor([(7 * t + p) % 97 + 3 for t, p in zip(src, positions, strict=True)])

    def copy_out(self, ids):
        log, k = self.log, self.k

        class Host:
            def tolist(self):
                log.append(("read", k))
                return ids.tolist()

        return Host()


def _fake_engine(overlap: bool, log: list, moves: list):
    from hfserve.fast import scheduler

    eng = scheduler.FastEngine.__new__(scheduler.FastEngine)
    eng.decoder, eng.eos_ids, eng.max_batch, eng.chunk, eng.pack = _FakeDecoder(log), {32}, 4, 0, 0
    eng.overlap, eng._ahead = overlap, None
    eng.fm = type("FM", (), {"move_slot": lambda self, *a: moves.append(a)})()
    return eng


def _fake_run(overlap: bool, specs: list[tuple[int, bool]]) -> tuple[dict, list, list]:
    """Decode requests (max_tokens, ignore_eos) from token 11 at position 4 each until all finish."""
    import asyncio

    from hfserve import engine as engine_mod
    from hfserve.fast import scheduler

    log: list = []
    moves: list = []
    eng = _fake_engine(overlap, log, moves)
    loop = asyncio.new_event_loop()
    reqs = [engine_mod.GenRequest(prompt_ids=[5], max_tokens=n, temperature=0.0, top_p=1.0, seed=None,
                                  ignore_eos=ign, logprobs=None, loop=loop) for n, ign in specs]
    active = []
    for i, r in enumerate(reqs):
        s = scheduler._FSeq(r, None)
        s.last, s.pos, r.n_generated = 11 + i, 4, 1
        active.append(s)
    late: list = []
    while active:
        active, late = eng._decode(active, late)
    loop.close()
    return {i: list(r.events._buf) for i, r in enumerate(reqs)}, log, moves


def test_overlap_schedule_launches_ahead_and_streams_the_same_events() -> None:
    """--overlap-schedule: step k+1 is launched from step k's ids on the device *before* the host reads
    step k's ids; every request still gets exactly the plain path's events (tokens, a stop token, its
    length), and a row finishing mid-batch is compacted away as the plain path does."""
    specs = [(9, True), (4, True), (12, False), (6, True)]  # the third stops at its 4th id (32, the stop id)
    plain, plain_log, plain_moves = _fake_run(False, specs)
    ovl, log, moves = _fake_run(True, specs)
    assert ovl == plain
    assert plain[2][-1] == ("done", "stop") and len(plain[2]) == 5 and len(plain[0]) == 9
    # Rows left the batch mid-way both ways (slot moves); with the step ahead read too, the moved rows'
    # KV is one position longer (the real engine's test below checks the tokens after such moves).
    assert plain_moves and moves and all(m[2] == 8 for m in moves) and all(m[2] == 7 for m in plain_moves)
    # Launched ahead: after the first (host) launch, each launch comes from the device and before the read
    # of the step it follows from.
    assert log[:3] == [("launch", 1, 4, "host"), ("launch", 2, 4, "device"), ("read", 1)]
    assert sum(e[0] == "launch" and e[3] == "device" for e in log) == 5
    for i, e in enumerate(log):
        if e[0] == "launch" and e[3] == "device":
            assert ("read", e[1] - 1) not in log[:i], log  # step k+1 queued before step k is read
    # As many steps as the plain path (8: the longest request's): none launched past the end, since the
    # last step ends every row by its length and nothing follows it.
    assert [e for e in log if e[0] == "launch"][-1][1] == 8 == len([e for e in plain_log if e[0] == "launch"])
    assert log[-1] == ("read", 8)


def test_overlap_schedule_off_reads_each_step_before_the_next() -> None:
    """The plain path (the default) never launches a step before reading the one before: the check above
    can tell the two apart."""
    _, log, _ = _fake_run(False, [(5, True), (3, True)])
    assert all(e[3] == "host" for e in log if e[0] == "launch")


def test_overlap_burst_gives_the_unbatched_tokens(tiny_model: Path) -> None:
    """The real engine (CPU, tiny model) with --overlap-schedule: a burst of 6 through 4 slots (rows
    finishing at different steps, queued requests joining as slots free) decodes exactly the tokens of
    one request at a time, and its decode steps did run ahead."""
    from hfserve.fast import scheduler

    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(4, 2000, (n,), generator=gen).tolist() for n in (12, 30, 7, 21, 16, 9)]
    fed: list[int] = []
    real_feed = scheduler.GraphDecoder._feed

    def feed(self, prev, n):
        fed.append(n)
        return real_feed(self, prev, n)

    scheduler.GraphDecoder._feed = feed
    try:
        ovl = _engine_outputs(tiny_model, prompts, [], max_batch_size=4, prefill_pack=64, overlap_schedule=True)
    finally:
        scheduler.GraphDecoder._feed = real_feed
    alone = _engine_outputs(tiny_model, prompts, [], max_batch_size=1)
    assert ovl == alone
    assert len(fed) >= 5 and max(fed) >= 2, fed


def test_logprob_table_rows_are_token_events() -> None:
    """A step's logprobs built for the whole batch at once (one table, one device->host copy) are, row
    by row, exactly the per-row token_event's: the chosen token's logprob (argmax or any other id) and
    the top k, for every k up to the table's width."""
    from hfserve.engine import logprob_table, table_event, token_event

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 50, generator=gen) * 4
    ids = torch.tensor([int(logits[0].argmax()), 7, 49, 0, int(logits[4].argmax())])
    rows = logprob_table(logits, ids, 3).tolist()
    for i, row in enumerate(rows):
        assert table_event(row, None) == int(ids[i])
        for k in (0, 2, 3):
            assert table_event(row, k) == token_event(int(ids[i]), logits[i], k), (i, k)
    assert logprob_table(logits, ids, 0).shape == (5, 2)


def test_greedy_logprobs_come_from_one_table_per_step(tiny_model: Path, monkeypatch) -> None:
    """Greedy requests asking for logprobs (as the bench's and the gates' all do): a burst through 4
    slots gives one request at a time's tokens and logprobs, both plain and with --overlap-schedule
    (which now runs for them: steps launched from the device), and no row's logprob is computed on
    its own: one table per decode step and per packed prefill."""
    from hfserve.fast import scheduler

    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(4, 2000, (n,), generator=gen).tolist() for n in (12, 30, 7, 21, 16, 9)]
    calls = {"table": 0, "row": 0, "fed": 0}
    real_table, real_event, real_feed = scheduler.logprob_table, scheduler.token_event, scheduler.GraphDecoder._feed

    def table(*a):
        calls["table"] += 1
        return real_table(*a)

    def event(*a):
        calls["row"] += 1
        return real_event(*a)

    def feed(self, prev, n):
        calls["fed"] += 1
        return real_feed(self, prev, n)

    alone = _engine_outputs(tiny_model, prompts, [], logprobs=2, max_batch_size=1)
    monkeypatch.setattr(scheduler, "logprob_table", table)
    monkeypatch.setattr(scheduler, "token_event", event)
    monkeypatch.setattr(scheduler.GraphDecoder, "_feed", feed)
    outs = {}
    for overlap in (False, True):
        calls.update(table=0, row=0, fed=0)
        outs[overlap] = _engine_outputs(tiny_model, prompts, [], logprobs=2, max_batch_size=4, prefill_pack=64,
                                        overlap_schedule=overlap)
        assert calls["row"] == 0 and calls["table"] >= 9, (overlap, calls)  # 9: the longest request's steps
        assert (calls["fed"] >= 5) == overlap, calls
    for out in outs.values():
        assert [[t[0] for t in r] for r in out] == [[t[0] for t in r] for r in alone]
        for r, a in zip(out, alone, strict=True):
            for (_, lp, top), (_, lp1, top1) in zip(r, a, strict=True):
                assert lp == pytest.approx(lp1, abs=1e-4) and [i for i, _ in top] == [i for i, _ in top1]
                assert len(top) == 2 and [v for _, v in top] == pytest.approx([v for _, v in top1], abs=1e-4)


@torch.inference_mode()
def test_mm_kernels_equal_triton(interpreted, monkeypatch) -> None:
    """kernels="triton-mm": a batch-3 decode step runs its projections through kernels.mm_gemm (the skinny
    Triton GEMM, here with a config listed for the tiny model's shapes) and equals kernels="triton" (logits
    within the step tolerance, the ids, the KV pool); the GEMM one K tile short is caught; with nothing
    listed it is triton's step bit for bit."""
    from hfserve import hfkernels as kernels

    dtype = torch.float32  # (bf16's random tiny model has near-ties: its greedy ids may flip within the tolerance)
    close = _step_close(dtype)

    fm, prompts = _prefilled(dtype)
    K0, V0 = fm.K.clone(), fm.V.clone()
    b = len(prompts)
    assert b > kernels.MV_MAX_ROWS

    def run(kern: str) -> tuple[torch.Tensor, list[int]]:
        return _one_step(fm, prompts, K0, V0, kern)

    want, want_ids = run("triton")
    Kw, Vw = fm.K.clone(), fm.V.clone()
    cfg = kernels.MmCfg(32, 32, 4, 2)
    L0 = fm.layers[0]
    shapes = {tuple(t.shape) for t in (L0["qkv"], L0["o"], L0["gu"], L0["down"], fm.lm_head)}
    patch_kernels(monkeypatch, kernels, "MM_CONFIGS", {(16, n, k): cfg for n, k in shapes})
    seen, real = [], kernels.mm_gemm
    patch_kernels(monkeypatch, kernels, "mm_gemm", lambda x, w, c, **kw: seen.append(tuple(w.shape)) or real(x, w, c, **kw))
    got, got_ids = run("triton-mm")
    assert len(seen) == 4 * len(fm.layers) + 1 and seen[-1] == tuple(fm.lm_head.shape)
    assert close(got, want), (got - want).abs().max()
    assert got_ids == want_ids and close(fm.K, Kw) and close(fm.V, Vw)
    patch_kernels(monkeypatch, kernels, "mm_gemm", lambda x, w, c, **kw: real(x, w, c, nt_short=1))
    assert not close(run("triton-mm")[0], want)  # both ways: one K tile short is caught
    patch_kernels(monkeypatch, kernels, "MM_CONFIGS", {})
    assert torch.equal(run("triton-mm")[0], want)


@torch.inference_mode()
def test_mm_glu_is_the_two_launches_in_one(interpreted, monkeypatch) -> None:
    """--mm-glu on (kernels="triton-mm"): a batch-3 decode step runs gate/up + SwiGLU as one mm_gemm launch with
    glu (the listed config) per layer and equals the two launches (logits, ids, KV pool; triton_interp.same_rounding); the GLU
    launch one K tile short is caught; unlisted, the step is the two launches'. Refused without triton-mm."""
    from hfserve import hfkernels as kernels

    fm, prompts = _prefilled(torch.float32)
    K0, V0 = fm.K.clone(), fm.V.clone()
    cfg = kernels.MmCfg(32, 32, 4, 2)
    L0 = fm.layers[0]
    shapes = {tuple(t.shape) for t in (L0["qkv"], L0["o"], L0["gu"], L0["down"], fm.lm_head)}
    patch_kernels(monkeypatch, kernels, "MM_CONFIGS", {(16, n, k): cfg for n, k in shapes})
    patch_kernels(monkeypatch, kernels, "MM_GLU_CONFIGS", {(16, *L0["gu"].shape): kernels.MmCfg(16, 32, 4, 2)})

    def run(glu: bool) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        return (*_one_step(fm, prompts, K0, V0, "triton-mm", mm_glu=glu), fm.K.clone())

    want, want_ids, want_k = run(False)
    seen, real = [], kernels.mm_gemm
    patch_kernels(monkeypatch, kernels, "mm_gemm", lambda x, w, c, **kw: seen.append(kw.get("glu", 0)) or real(x, w, c, **kw))
    got, got_ids, got_k = run(True)
    assert seen.count(fm.inter) == len(fm.layers) and len(seen) == 4 * len(fm.layers) + 1  # gate/up + SwiGLU: 1 launch
    assert same_rounding(got, want) and got_ids == want_ids and same_rounding(got_k, want_k)
    patch_kernels(monkeypatch, kernels, "mm_gemm", lambda x, w, c, **kw: real(x, w, c, nt_short=int(bool(kw.get("glu"))), **kw))
    assert not torch.allclose(run(True)[0], want, atol=1e-3)  # both ways: the GLU launch one K tile short is caught
    patch_kernels(monkeypatch, kernels, "mm_gemm", real)
    patch_kernels(monkeypatch, kernels, "MM_GLU_CONFIGS", {})
    assert torch.equal(run(True)[0], want)  # nothing listed: the two launches
    patch_kernels(monkeypatch, kernels, "MM_GLU_CONFIGS", {(16, *L0["gu"].shape): kernels.MmCfg(16, 32, 4, 2)})
    fm.set_kernels("triton-mm")
    fm.set_mm_glu(True)
    seen.clear()
    patch_kernels(monkeypatch, kernels, "mm_gemm", lambda x, w, c, **kw: seen.append(kw.get("glu", 0)) or real(x, w, c, **kw))
    _one_step(fm, prompts, K0, V0, "triton")  # a later set_kernels away from triton-mm: no GLU launch is left
    assert not seen
    fm.set_kernels("triton")
    with pytest.raises(ValueError, match="--mm-glu on needs --kernels triton-mm"):
        fm.set_mm_glu(True)
    fm.set_kernels("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_mm_norm_folds_the_norms_into_the_gemms(dtype, interpreted, monkeypatch) -> None:
    """--mm-norm on (kernels="triton-mm"): a batch-3 decode step runs no norm launch: each norm is a GEMM's prologue
    (QKV, gate/up, lm_head; with --mm-glu the GLU launch's), each residual add a GEMM's epilogue (O; down through
    split-K's reduction); logits within the step tolerance of the unfused step, the same ids and KV pool (K, V come
    from the first norm's GEMM: equal within the tolerance). Both ways: the norm GEMMs one K tile short, or the
    residual adds one tile short, are caught. Unlisted shapes: the norm launch, or the GEMM then add_rmsnorm where a
    residual add is unlisted (the unfused step's launches: bit for bit). Refused without triton-mm."""
    from hfserve import hfkernels as kernels

    close = _step_close(dtype)
    fm, prompts = _prefilled(dtype)
    K0, V0 = fm.K.clone(), fm.V.clone()
    L0 = fm.layers[0]
    cfgs = {(16, *t.shape): kernels.MmCfg(32, 32, 4, 2) for t in (L0["qkv"], L0["o"], L0["gu"], fm.lm_head)}
    patch_kernels(monkeypatch, kernels, "MM_CONFIGS", cfgs)
    patch_kernels(monkeypatch, kernels, "MM_GLU_CONFIGS", {(16, *L0["gu"].shape): kernels.MmCfg(16, 32, 4, 2)})
    fuse = {("norm", 16, *t.shape): kernels.MmCfg(32, 32, 4, 2) for t in (L0["qkv"], L0["gu"], fm.lm_head)}
    fuse |= {("res", 16, *L0["o"].shape): kernels.MmCfg(16, 32, 4, 2, 1, True),
             ("res", 16, *L0["down"].shape): kernels.MmCfg(32, 32, 4, 2, 2),  # split-K: the add in the reduction
             ("glu_norm", 16, *L0["gu"].shape): kernels.MmCfg(16, 32, 4, 2)}
    patch_kernels(monkeypatch, kernels, "MM_FUSE_CONFIGS", fuse)

    def run(**kw: bool) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        return (*_one_step(fm, prompts, K0, V0, "triton-mm", **kw), fm.K.clone())

    want, want_ids, want_k = run()
    seen, real = [], kernels.mm_gemm
    patch_kernels(monkeypatch, kernels, "mm_gemm", lambda x, w, c, **kw: seen.append(
        ("n" if kw.get("norm") else "") + ("r" if kw.get("res") is not None else "") + ("g" if kw.get("glu") else ""))
        or real(x, w, c, **kw))
    norms, ops = [], kernels._OPS["triton-mm"]  # the step's norm launches, counted where FastModel takes them
    monkeypatch.setitem(kernels._OPS, "triton-mm", dataclasses.replace(ops, **{
        name: lambda *a, _f=getattr(ops, name), **k: norms.append(1) or _f(*a, **k) for name in ("rmsnorm", "add_rmsnorm")}))
    n = len(fm.layers)
    run()
    assert len(norms) == 2 * n + 1  # unfused: layer 0's norm, then an add + norm after O and after down
    norms.clear()
    for glu in (False, True):
        seen.clear()
        got, got_ids, got_k = run(mm_norm=True, mm_glu=glu)
        assert seen.count("r") == 2 * n and seen.count("n") == n + 1 + (0 if glu else n), seen  # QKV, lm_head (gate/up)
        assert seen.count("ng") == (n if glu else 0) and len(seen) == 4 * n + 1, seen
        assert not norms  # no norm launch left in the step
        assert close(got, want) and got_ids == want_ids and close(got_k, want_k), (got - want).abs().max()
    patch_kernels(monkeypatch, kernels, "MM_FUSE_CONFIGS", {k: v for k, v in fuse.items() if k[0] != "glu_norm"
                                                     and k[2:] != tuple(L0["gu"].shape)})
    seen.clear()
    got = run(mm_norm=True, mm_glu=True)[0]  # gate/up's fused launches not listed: ln2's norm launch, the GLU launch
    assert seen.count("g") == n and seen.count("ng") == 0 and len(norms) == n and close(got, want), seen
    patch_kernels(monkeypatch, kernels, "MM_FUSE_CONFIGS", {k: v for k, v in fuse.items() if k[0] != "res"})
    seen.clear()
    norms.clear()
    got = run(mm_norm=True)[0]  # no residual add listed: GEMM + add_rmsnorm (today's two launches, not three), the
    assert seen.count("n") == 1 and "r" not in seen and len(norms) == 2 * n and close(got, want), seen  # next GEMM
    # over its rows (layer 0's fused)
    seen.clear()
    norms.clear()
    got = run(mm_norm=True, mm_glu=True)[0]  # with --mm-glu: its GLU launch over add_rmsnorm's rows
    assert seen.count("g") == n and "r" not in seen and len(norms) == 2 * n and close(got, want), seen
    patch_kernels(monkeypatch, kernels, "MM_FUSE_CONFIGS", fuse)
    short = {"n": lambda kw: bool(kw.get("norm")), "r": lambda kw: kw.get("res") is not None}
    for which in ("n", "r"):  # both ways: a short norm GEMM, or a short residual add, is caught
        patch_kernels(monkeypatch, kernels, "mm_gemm", lambda x, w, c, _s=short[which], **kw: real(x, w, c, nt_short=int(_s(kw)), **kw))
        assert not close(run(mm_norm=True)[0], want), which
    patch_kernels(monkeypatch, kernels, "mm_gemm", real)
    patch_kernels(monkeypatch, kernels, "MM_FUSE_CONFIGS", {})
    fb = run(mm_norm=True)[0]  # nothing listed: the norm and add_rmsnorm launches, the unfused step bit for bit
    assert torch.equal(fb, want)
    fm.set_kernels("triton-mv")
    with pytest.raises(ValueError, match="--mm-norm on needs --kernels triton-mm"):
        fm.set_mm_norm(True)
    fm.set_kernels("torch")


@torch.inference_mode()
def test_pdl_reaches_every_triton_launch_of_the_decode_step(interpreted, monkeypatch) -> None:
    """--pdl on (kernels.set_pdl): every Triton kernel a decode step launches -- batch 3 under triton-mm with and
    without --mm-norm/--mm-glu (norms, SwiGLU, RoPE + store, split attention and its reduction, the skinny GEMM and
    split-K's reduction), batch 1 under triton-mv (the GEMV) -- gets _pdl's launch keywords, the GEMMs and GEMVs
    with the weight prefetch's; a launch site that forgot them would show here. Off (and on the CPU, where the
    interpreter cannot run griddepcontrol) the keywords are none. Refused with the torch kernels. Whether each
    kernel waits before it touches memory is compile_check.py --pdl's (test_kernels)."""
    import types

    from hfserve import hfkernels as kernels
    from hfserve.fast import set_pdl
    from triton.runtime.interpreter import InterpretedFunction

    fm, prompts = _prefilled(torch.float32)
    K0, V0 = fm.K.clone(), fm.V.clone()
    L0 = fm.layers[0]
    cfgs = {(16, *t.shape): kernels.MmCfg(32, 32, 4, 2) for t in (L0["qkv"], L0["o"], L0["gu"], fm.lm_head)}
    cfgs[(16, *L0["down"].shape)] = kernels.MmCfg(32, 32, 4, 2, 2)  # split-K: its reduction launch too
    patch_kernels(monkeypatch, kernels, "MM_CONFIGS", cfgs)
    patch_kernels(monkeypatch, kernels, "MM_GLU_CONFIGS", {(16, *L0["gu"].shape): kernels.MmCfg(16, 32, 4, 2)})
    fuse = {("norm", 16, *t.shape): kernels.MmCfg(32, 32, 4, 2) for t in (L0["qkv"], L0["gu"], fm.lm_head)}
    fuse |= {("res", 16, *L0["o"].shape): kernels.MmCfg(16, 32, 4, 2, 1, True),
             ("res", 16, *L0["down"].shape): kernels.MmCfg(32, 32, 4, 2, 2)}
    patch_kernels(monkeypatch, kernels, "MM_FUSE_CONFIGS", fuse)
    want = _one_step(fm, prompts, K0, V0, "triton-mm")
    launches = []
    run = InterpretedFunction.run
    monkeypatch.setattr(InterpretedFunction, "run", lambda self, *a, **kw: launches.append(
        (self.fn.__name__, {k for k in kw if k in ("PDL", "launch_pdl", "PF", "PF_LINES")})) or run(self, *a, **kw))
    pdl = kernels._pdl
    # the interpreter runs the keywords' off path (PDL False): what is checked is that every launch passes them
    patch_kernels(monkeypatch, kernels, "_pdl", lambda t, block_k=0: {"PDL": False, "launch_pdl": False} | (
        {"PF": 0, "PF_LINES": 1} if block_k else {}))
    got = _one_step(fm, prompts, K0, V0, "triton-mm")
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    _one_step(fm, prompts, K0, V0, "triton-mm", mm_norm=True, mm_glu=True)
    _one_step(fm, prompts[:1], K0, V0, "triton-mv")
    names = {n for n, _ in launches}
    assert {"_rmsnorm_kernel", "_silu_mul_kernel", "_rope_store_kernel", "_decode_attn_split_kernel",
            "_attn_reduce_kernel", "_mm_kernel", "_splitk_reduce_kernel", "_gemv_kernel"} <= names, names
    assert all({"PDL", "launch_pdl"} <= kw for _, kw in launches), [n for n, kw in launches if "PDL" not in kw]
    assert all({"PF", "PF_LINES"} <= kw for n, kw in launches if n in ("_mm_kernel", "_gemv_kernel"))
    patch_kernels(monkeypatch, kernels, "_pdl", pdl)
    try:
        fm.set_kernels("triton")
        set_pdl(fm, True)  # on: CPU tensors launch as before (no keywords); a CUDA one gets them
        assert kernels.pdl_on() and kernels._pdl(fm.K) == {}
        cuda = types.SimpleNamespace(is_cuda=True, element_size=lambda: 2)
        assert kernels._pdl(cuda) == {"PDL": True, "launch_pdl": True}
        assert kernels._pdl(cuda, 128) == {"PDL": True, "launch_pdl": True, "PF": kernels.PDL_PREFETCH, "PF_LINES": 2}
        set_pdl(fm, False)
        assert kernels._pdl(cuda, 128) == {}
        fm.set_kernels("torch")
        with pytest.raises(ValueError, match="--pdl on needs the Triton kernels"):
            set_pdl(fm, True)
    finally:
        kernels.set_pdl(False)


@torch.inference_mode()
def test_pdl_leaves_the_batch_1_step_alone(interpreted, monkeypatch) -> None:
    """--pdl on launches a batch-1 decode step (the GEMVs') without PDL's keywords -- on the H200 that step's graph ran
    0.43 ms slower with them -- and a batch-3 step with them; set_pdl's state is as it was after each step."""
    from hfserve import hfkernels as kernels
    from hfserve.fast import set_pdl
    from triton.runtime.interpreter import InterpretedFunction

    fm, prompts = _prefilled(torch.float32)
    K0, V0 = fm.K.clone(), fm.V.clone()
    launches: list[tuple[str, bool]] = []
    run = InterpretedFunction.run
    monkeypatch.setattr(InterpretedFunction, "run", lambda self, *a, **kw: launches.append(
        (self.fn.__name__, "PDL" in kw)) or run(self, *a, **kw))
    # _pdl as on a GPU, keyed on set_pdl's state as the real one is (the interpreter runs the keywords' off path)
    patch_kernels(monkeypatch, kernels, "_pdl", lambda t, block_k=0: {"PDL": False, "launch_pdl": False} if kernels.pdl_on()
                        else {})
    try:
        fm.set_kernels("triton-mm")
        set_pdl(fm, True)
        _one_step(fm, prompts[:1], K0, V0, "triton-mm")
        one, launches[:] = list(launches), []
        assert kernels.pdl_on()
        _one_step(fm, prompts, K0, V0, "triton-mm")
        assert len(prompts) > 1 and kernels.pdl_on()
        assert one and not any(p for _, p in one), [n for n, p in one if p]
        assert launches and all(p for _, p in launches), [n for n, p in launches if not p]
    finally:
        kernels.set_pdl(False)


@torch.inference_mode()
def test_batched_prefill_attention_equals_per_prompt(interpreted, monkeypatch) -> None:
    """prefill_attn="fused-batched": a pass of 7 whole prompts of one length in consecutive slots (a burst),
    one of another length and a continuation chunk attends in 2**k groups (4 + 2 + 1 of the run: one SDPA
    call each, per layer) and gives "fused"'s logits and KV; the grouping follows slots, lengths and starts."""
    import torch.nn.functional as F
    from hfserve.fast import model

    dtype = torch.float32
    tol = STEP_TOL[dtype]
    fm = FastModel(_random_llama(dtype), slots=10, capacity=64)
    gen = torch.Generator().manual_seed(9)
    run = [(torch.randint(0, 128, (6,), generator=gen), s, 0) for s in range(1, 8)]
    other = torch.randint(0, 128, (11,), generator=gen)
    cont = torch.randint(0, 128, (8,), generator=gen)
    fm.set_prefill_attn("fused")
    fm.prefill(cont[:3], 9, 0)
    parts = [*run, (other, 8, 0), (cont[3:], 9, 3)]
    K0, V0 = fm.K.clone(), fm.V.clone()
    want = fm.prefill_packed(parts, all_logits=True)
    Kw = fm.K.clone()
    calls = []

    class SpyF:  # torch.nn.functional itself stays real (the causal mask object checks for its SDPA)
        def __getattr__(self, name):
            return getattr(F, name)

        @staticmethod
        def scaled_dot_product_attention(q, *a, **kw):
            calls.append(q.shape[0])
            return F.scaled_dot_product_attention(q, *a, **kw)

    monkeypatch.setattr(model, "F", SpyF())
    fm.K.copy_(K0)
    fm.V.copy_(V0)
    fm.set_prefill_attn("fused-batched")
    got = fm.prefill_packed(parts, all_logits=True)
    assert torch.allclose(got, want, rtol=tol, atol=tol) and torch.allclose(fm.K, Kw, rtol=tol, atol=tol)
    assert calls[:5] == [4, 2, 1, 1, 1] and len(calls) == 5 * len(fm.layers)
    # Grouping: a slot gap, another length or a start > 0 ends a run.
    m = None
    rows = [(0, 6, 0, 0, m), (6, 12, 1, 0, m), (12, 18, 3, 0, m), (18, 24, 4, 0, m), (24, 30, 5, 0, m),
            (30, 35, 6, 0, m), (35, 41, 7, 2, m), (41, 47, 8, 0, m)]
    assert [g[3] for g in model._attn_groups(rows)] == [2, 2, 1, 1, 1, 1]


def test_batched_prefill_calls_leave_cudnn_out_on_the_gpu_under_sdpa_auto() -> None:
    """--sdpa auto: fused-batched's calls over several prompts on a GPU may use flash, efficient or math but not
    cuDNN (a plan built per new batch size, ~78 ms each on the H200); one prompt's call, the CPU and an
    explicit --sdpa keep their backends."""
    from hfserve.fast import model

    assert "CUDNN_ATTENTION" not in model.sdpa_backends("auto", True, "cuda")
    assert model.sdpa_backends("auto", True, "cuda")[0] == "FLASH_ATTENTION"
    assert model.sdpa_backends("auto", False, "cuda") is None
    assert model.sdpa_backends("auto", True, "cpu") is None
    assert model.sdpa_backends("math", True, "cuda") == ["MATH"]
    assert model.sdpa_backends("flash", False, "cpu") == ["FLASH_ATTENTION"]


@torch.inference_mode()
def test_lowp_decode_attention_equals_triton(interpreted, monkeypatch) -> None:
    """decode_attn="lowp": every layer's decode attention is launched with kernels.decode_attn_config's
    cfg (bf16 dots; the table's launch where it lists the bucket) and the bf16 step equals the default
    launch's within the step tolerance, ids and KV pool too; the same check catches the lowp launch reading
    one cache column short. Without the Triton kernels the knob is refused."""
    from hfserve import hfkernels as kernels

    dtype = torch.bfloat16
    tol = STEP_TOL[dtype]
    close = _step_close(dtype)

    fm, prompts = _prefilled(dtype)
    with pytest.raises(ValueError, match="needs the Triton kernels"):
        fm.set_decode_attn("lowp")
    K0, V0 = fm.K.clone(), fm.V.clone()
    b = len(prompts)
    seen, real = [], kernels.decode_attn
    short = []

    def spy(q, K, V, layer, B, pos, ctx, scale, out=None, splits=None, cfg=None):
        seen.append(cfg)
        return real(q, K, V, layer, B, pos - len(short), ctx, scale, out, splits, cfg)

    monkeypatch.setitem(kernels._OPS, "triton", dataclasses.replace(kernels._OPS["triton"], decode_attn=spy))

    def run(how: str) -> tuple[torch.Tensor, list[int]]:
        return _one_step(fm, prompts, K0, V0, "triton", decode_attn=how)

    want, want_ids = run("default")
    assert seen == [None] * len(fm.layers)  # the default launch: attn_config's table, as before the knob
    Kw, Vw = fm.K.clone(), fm.V.clone()
    seen.clear()
    tuned = kernels.AttnCfg(2, 16, 2, 1, True)
    monkeypatch.setitem(kernels.ATTN_LOWP, (b, 256), tuned)
    got, got_ids = run("lowp")
    assert seen == [tuned] * len(fm.layers)
    assert close(got, want), (got - want).abs().max()
    assert all(float(want[i, t]) >= float(want[i].max()) - 2 * tol for i, t in enumerate(got_ids))
    assert close(fm.K, Kw) and close(fm.V, Vw)
    monkeypatch.delitem(kernels.ATTN_LOWP, (b, 256))
    seen.clear()
    assert close(run("lowp")[0], want) and seen == [kernels.AttnCfg(lowp=True)] * len(fm.layers)  # unlisted bucket
    short.append(1)
    assert not close(run("lowp")[0], want)  # both ways: one cache column short is caught


@torch.inference_mode()
def test_the_engine_asks_for_its_pools_launch(interpreted, monkeypatch) -> None:
    """The engine's decode attention launch comes from decode_attn_config with its own pool's dtype: an fp8
    pool takes ATTN_LOWP_FP8's entry, a bf16 pool ATTN_LOWP's; --decode-attn default passes none."""
    from hfserve import hfkernels as kernels

    for name, table in kernels.tables_for("NVIDIA H200").items():  # the H200's tables: ATTN_LOWP lists (4, 1024)
        patch_kernels(monkeypatch, kernels, name, table)
    fp8cfg = kernels.AttnCfg(1, 64, 4, 1, True, True)
    monkeypatch.setitem(kernels.ATTN_LOWP_FP8, (4, 1024), fp8cfg)
    got = {}
    for kv in ("auto", "fp8"):
        fm = FastModel(_random_llama(torch.bfloat16), slots=4, capacity=64, kv_cache_dtype=kv)
        fm.set_kernels("triton")
        assert fm._attn_kw(4, 1024) == {}
        fm.set_decode_attn("lowp")
        got[kv] = fm._attn_kw(4, 1024)["cfg"]
    assert got == {"auto": kernels.ATTN_LOWP[(4, 1024)], "fp8": fp8cfg}


@pytest.mark.parametrize("rounds", [1, 2])
def test_prompts_arriving_during_a_prefill_pass_are_prefilled_before_the_next_decode_step(rounds) -> None:
    """prefill_rounds=2: a burst's first pass takes the prompts there when the worker woke; those that arrive
    while it runs are prefilled next, before any decode step (once: a third arriving during that second pass
    waits for one step, so a stream of arrivals cannot hold decoding back). prefill_rounds=1 (the default):
    each pass is followed by a decode step of the rows there. Every request still gets all its tokens."""
    import asyncio
    import queue
    import threading

    from hfserve import engine as engine_mod
    from hfserve.fast import scheduler

    log: list = []
    eng = _fake_engine(False, log, [])
    eng.prefill_rounds = rounds
    eng.jobs = queue.Queue()
    eng.fm = type("FM", (), {"move_slot": lambda *a: None, "device": torch.device("cpu")})()
    eng._step_log_path = eng._profile_path = None
    loop = asyncio.new_event_loop()
    reqs = [engine_mod.GenRequest(prompt_ids=[5], max_tokens=4, temperature=0.0, top_p=1.0, seed=None,
                                  ignore_eos=True, logprobs=None, loop=loop) for _ in range(3)]

    def prefill_some(s, row, budget):
        i = reqs.index(s.req)
        log.append(("prefill", i))
        if i + 1 < len(reqs):
            eng.submit(reqs[i + 1])  # the next prompt arrives while this one's pass runs
        s.pos, eng._pending_logits = 1, None
        return True, 1

    def first_token(s, row, notify=True):
        s.req.push("token", 101)
        s.last, s.req.n_generated = 101, 1
        if notify:
            scheduler.wake([s.req])
        return False

    eng._first_token, eng._prefill_some = first_token, prefill_some

    async def handler(r) -> list:
        got = []
        while True:
            for kind, payload in await r.events.get_batch():
                got.append(payload)
                if kind == "done":
                    return got

    threading.Thread(target=eng._loop, daemon=True).start()
    eng.submit(reqs[0])

    async def main() -> list:
        return await asyncio.wait_for(asyncio.gather(*(handler(r) for r in reqs)), 10)

    outs = loop.run_until_complete(main())
    loop.close()
    assert all(len(o) == 5 and o[-1] == "length" for o in outs), outs
    launches = [e for e in log if e[0] == "launch"]
    if rounds == 2:
        assert log[:3] == [("prefill", 0), ("prefill", 1), launches[0]] and launches[0][2] == 2
        assert log.index(("prefill", 2)) == 3 and launches[1][2] == 3  # the third waited for one step, no longer
    else:
        assert log[:4] == [("prefill", 0), launches[0], ("prefill", 1), launches[1]]
        assert [e[2] for e in launches[:3]] == [1, 2, 3] and log.index(("prefill", 2)) == 4


@torch.inference_mode()
def test_fp8_kv_cache_matches_its_torch_reference(interpreted, monkeypatch) -> None:
    """kv_cache_dtype="fp8": the pool is float8 e4m3. Prefill (Triton RoPE + store over the packed rows, SDPA
    over the pool widened) equals the torch path over an fp8 pool (torch RoPE, slice stores that round to e4m3,
    SDPA over the widened copy) within twice the step tolerance (the two RoPEs differ by a bf16 ulp here and
    there, which moves a value across an e4m3 rounding boundary: 2**-3 apart); a decode step (split-KV
    attention reading fp8, both dot modes) equals decode_attn_ref over the widened pool within the step
    tolerance. Both stores (prefill's rows kernel, the step's per-row kernel) hold exactly the bf16 pool's
    first-layer keys and values rounded to e4m3. One cache column short is caught; the torch decode path
    refuses the fp8 pool."""
    from hfserve import hfkernels as kernels

    dtype = torch.bfloat16
    tol = STEP_TOL[dtype]
    close = _step_close(dtype)

    def model(kv: str, kern: str, attn: str) -> FastModel:
        return FastModel(_random_llama(dtype), slots=4, capacity=300, kernels=kern, prefill_attn=attn,
                         kv_cache_dtype=kv)

    fp8, ref, wide = model("fp8", "triton", "fused"), model("fp8", "triton", "torch"), model("auto", "triton", "fused")
    assert fp8.K.dtype == fp8.V.dtype == torch.float8_e4m3fn and fp8.kv_fp8 and not wide.kv_fp8
    prompts = [torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(s)) for n, s in PROMPTS]
    for slot, p in enumerate(prompts):
        got, want = fp8.prefill(p[:-1], slot, 0, True), ref.prefill(p[:-1], slot, 0, True)
        assert torch.allclose(got.float(), want.float(), rtol=2 * tol, atol=2 * tol), (got - want).abs().max()
        wide.prefill(p[:-1], slot, 0)
    # (values, not bytes: the interpreter's conversion drops the sign of a zero)
    assert torch.equal(fp8.K[0].float(), wide.K[0].to(torch.float8_e4m3fn).float())
    assert torch.equal(fp8.V[0].float(), wide.V[0].to(torch.float8_e4m3fn).float())
    ref.K.copy_(fp8.K)  # the decode step from the same pool
    ref.V.copy_(fp8.V)
    ref.set_kernels("torch")
    with pytest.raises(ValueError, match="fp8 needs the Triton kernels"):
        ref.decode(torch.tensor([1]), torch.tensor([4]), 256)
    short: list[int] = []
    real = kernels.decode_attn

    def attn(q, K, V, layer, B, pos, ctx, scale, out=None, splits=None, cfg=None):
        return real(q, K, V, layer, B, pos - len(short), ctx, scale, out, splits, cfg)

    monkeypatch.setitem(kernels._OPS, "triton", dataclasses.replace(kernels._OPS["triton"], decode_attn=attn))
    monkeypatch.setitem(kernels._OPS, "torchref", dataclasses.replace(kernels._OPS["triton"],
                                                                     decode_attn=kernels.decode_attn_ref))
    b = len(prompts)
    toks, pos = [int(p[-1]) for p in prompts], [len(p) - 1 for p in prompts]
    K0, V0 = fp8.K.clone(), fp8.V.clone()

    def step(fm: FastModel, ops: str, how: str = "default") -> torch.Tensor:
        fm.K.copy_(K0)
        fm.V.copy_(V0)
        fm.set_kernels("triton")
        fm.ops = kernels._OPS[ops]
        fm.set_decode_attn(how)
        logits, _ = GraphDecoder(fm, max_batch=b, use_graphs=False).step(toks, pos)
        return logits[:b].clone()

    want = step(ref, "torchref")
    Kw, Vw = ref.K.clone(), ref.V.clone()
    for how in ("default", "lowp"):
        got = step(fp8, "triton", how)
        assert close(got, want), (how, (got - want).abs().max())
        # (layer 0 only: above it the two attentions' last-bit differences move values across e4m3 steps)
        assert torch.equal(fp8.K[0].float(), Kw[0].float()) and torch.equal(fp8.V[0].float(), Vw[0].float())
    # The step's store (one program per row and head) rounds as torch does: layer 0's new keys and values
    # are the bf16 pool's (same token, same position) rounded to e4m3.
    GraphDecoder(wide, max_batch=b, use_graphs=False).step(toks, pos)
    rows, cols = torch.arange(b), torch.tensor(pos)
    for new, ref16 in ((fp8.K, wide.K), (fp8.V, wide.V)):
        assert torch.equal(new[0, rows, :, cols].float(), ref16[0, rows, :, cols].to(torch.float8_e4m3fn).float())
    short.append(1)
    assert not close(step(fp8, "triton"), want)  # both ways: one cache column short is caught
