"""The fast engine's Triton kernels agree with their torch references, on the CPU (interpreter).

Each kernel is checked against the torch code it replaces (hfserve.hfkernels keeps both),
in float32 and bfloat16, and "both ways": the same tolerance check must reject a deliberately wrong
variant (perturbed eps, RoPE rotating the wrong way, attention one position short), so a pass means
the check can see an error of that size. Last, a Llama-shaped decode step built from the triton ops
equals the same step built from the torch ops (logits, greedy ids and the KV pool it writes).

Tolerances: float32 1e-5 (same arithmetic, only summation order differs). bfloat16 rtol = atol =
2**-6, two bf16 ulps on values of order one: the kernels round exactly where torch does, but
Triton's CPU interpreter rounds float32 -> bfloat16 toward zero where the GPU (and torch) round to
nearest even, so each rounding step may land one ulp off; attention's probabilities are rounded to
bf16 in torch but kept in float32 here. The wrong variants miss by 3x (bf16 eps) to 100x that.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="triton is not installed: the kernels cannot run, even interpreted")

from triton_interp import import_interpreted, patch_kernels, same_rounding, tree_env  # noqa: E402  (beside this file)

K = import_interpreted()


@pytest.fixture(autouse=True)
def _h200_tables(monkeypatch):
    """The launch tables the engine serves on the H200 (hfserve/tables/NVIDIA_H200.json), as each test's."""
    for name, table in K.tables_for("NVIDIA H200").items():
        patch_kernels(monkeypatch, K, name, table)


@pytest.fixture(autouse=True, scope="module")
def _interpret():
    """The interpreter reads TRITON_INTERPRET at each launch too; keep it set only for this module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        yield

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -6}
# The small shape: 2 layers, B=3 of 4 slots, 4 q heads over 2 kv heads, head_dim 16, bucket 64.
LAYERS, SLOTS, NH, NKV, HD, CAP, B, CTX = 2, 4, 4, 2, 16, 80, 3, 64
POS = torch.tensor([5, 33, 63])  # odd positions; the last at the bucket's end
EPS = 1e-5


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    """The one check every test uses, both ways: |got - want| <= tol + tol * |want| elementwise."""
    tol = TOL[dtype]
    return bool(torch.allclose(got.float(), want.float(), rtol=tol, atol=tol))


def _rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _pool(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (LAYERS, SLOTS, NKV, CAP, HD)
    return _rand(*shape, dtype=dtype, seed=seed), _rand(*shape, dtype=dtype, seed=seed + 1)


def _tables(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # FastModel's tables: float32 angles, rotate-half layout (the half repeated), cast to the model dtype.
    inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2).float() / HD))
    ang = torch.arange(CAP).float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# -- each kernel against its reference, and the check catching a wrong one --------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm(dtype) -> None:
    x, w = _rand(B, 2, 96, dtype=dtype, seed=1), _rand(96, dtype=dtype, seed=2)
    want = K.rmsnorm_ref(x, w, EPS)
    assert close(K.rmsnorm(x, w, EPS), want, dtype)
    out = torch.empty_like(x)
    assert K.rmsnorm(x, w, EPS, out=out) is out and close(out, want, dtype)
    assert not close(K.rmsnorm(x, w, 0.1), want, dtype)  # eps perturbed: caught


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rmsnorm(dtype) -> None:
    x, d, w = (_rand(B, 96, dtype=dtype, seed=s) for s in (3, 4, 5))
    w = w[0]
    r_want, y_want = K.add_rmsnorm_ref(x, d, w, EPS)
    r, y = K.add_rmsnorm(x, d, w, EPS)
    # The residual is one rounding of x + delta: exact in float32 (and on the GPU); the
    # interpreter's truncating bf16 cast may leave it one ulp off.
    same = torch.equal if dtype == torch.float32 else (lambda a, b: close(a, b, dtype))
    assert same(r, r_want)
    assert close(y, y_want, dtype)
    # In place: the residual overwrites x, the norm goes to a preallocated buffer.
    xi, out = x.clone(), torch.empty_like(x)
    r2, y2 = K.add_rmsnorm(xi, d, w, EPS, out=out, residual_out=xi)
    assert r2 is xi and y2 is out and same(xi, r_want) and close(out, y_want, dtype)
    assert not close(K.add_rmsnorm(x, d, w, 0.1)[1], y_want, dtype)  # eps perturbed: caught
    assert not close(K.add_rmsnorm(x, -d, w, EPS)[1], y_want, dtype)  # delta subtracted: caught


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype) -> None:
    inter = 40
    gu = _rand(B, 2 * inter, dtype=dtype, seed=6)
    want = K.silu_mul_ref(gu, inter)
    assert close(K.silu_mul(gu, inter), want, dtype)
    swapped = torch.cat([gu[:, inter:], gu[:, :inter]], dim=-1)
    assert not close(K.silu_mul(swapped, inter), want, dtype)  # gate and up swapped: caught


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store(dtype) -> None:
    cos, sin = _tables(dtype)
    qkv = _rand(B, (NH + 2 * NKV) * HD, dtype=dtype, seed=7)
    K0, V0 = _pool(dtype, 8)
    Kr, Vr, Kt, Vt = K0.clone(), V0.clone(), K0.clone(), V0.clone()
    q_want = K.rope_store_ref(qkv, cos, sin, POS, Kr, Vr, 1)
    q = K.rope_store(qkv, cos, sin, POS, Kt, Vt, 1)
    assert q.shape == (B, NH, HD)
    assert close(q, q_want, dtype) and close(Kt, Kr, dtype)
    assert torch.equal(Vt, Vr)  # v is copied, not computed
    # Only K[1, b, :, pos[b]] moved: everything else in the pool is untouched.
    touched = torch.zeros(LAYERS, SLOTS, NKV, CAP, dtype=torch.bool)
    touched[1, torch.arange(B), :, POS] = True
    assert torch.equal(Kt[~touched], K0[~touched]) and not torch.equal(Kt[touched], K0[touched])
    # Rotating the wrong way (the rotate-half sign flipped, i.e. -sin) is caught, in q and in K.
    Kw, Vw = K0.clone(), V0.clone()
    q_bad = K.rope_store(qkv, cos, -sin, POS, Kw, Vw, 1)
    assert not close(q_bad, q_want, dtype) and not close(Kw, Kr, dtype)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_prefill_rows(dtype, rows) -> None:
    """rope_store over packed prefill rows: two sequences' tokens (slot 2 at positions 4-7, slot 0 at
    0-2) each stored at (slots[b], pos[b]); a row sent to the wrong slot is caught. ``rows`` 4: the
    prefill kernel, 4 rows of a head per program (7 rows: a ragged last block), equal bit for bit to
    the one-(row, head)-per-program kernel; with the sign of sin flipped it is caught too."""
    cos, sin = _tables(dtype)
    pos = torch.tensor([4, 5, 6, 7, 0, 1, 2])
    slots = torch.tensor([2, 2, 2, 2, 0, 0, 0])
    qkv = _rand(len(pos), (NH + 2 * NKV) * HD, dtype=dtype, seed=17)
    K0, V0 = _pool(dtype, 18)
    Kr, Vr, Kt, Vt = K0.clone(), V0.clone(), K0.clone(), V0.clone()
    q_want = K.rope_store_ref(qkv, cos, sin, pos, Kr, Vr, 0, slots=slots)
    q = K.rope_store(qkv, cos, sin, pos, Kt, Vt, 0, slots=slots, rows=rows)
    assert close(q, q_want, dtype) and close(Kt, Kr, dtype) and torch.equal(Vt, Vr)
    touched = torch.zeros(LAYERS, SLOTS, NKV, CAP, dtype=torch.bool)
    touched[0, slots, :, pos] = True
    assert torch.equal(Kt[~touched], K0[~touched]) and not torch.equal(Kt[touched], K0[touched])
    Kw, Vw = K0.clone(), V0.clone()
    K.rope_store(qkv, cos, sin, pos, Kw, Vw, 0, slots=torch.tensor([2, 2, 2, 2, 1, 0, 0]), rows=rows)  # one row astray
    assert not close(Kw, Kr, dtype) and not torch.equal(Vw, Vr)
    if rows > 1:
        K1, V1 = K0.clone(), V0.clone()
        assert torch.equal(q, K.rope_store(qkv, cos, sin, pos, K1, V1, 0, slots=slots, rows=1))
        assert torch.equal(Kt, K1) and torch.equal(Vt, V1)
        Kb, Vb = K0.clone(), V0.clone()
        q_bad = K.rope_store(qkv, cos, -sin, pos, Kb, Vb, 0, slots=slots, rows=rows)
        assert not close(q_bad, q_want, dtype) and not close(Kb, Kr, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attn(dtype) -> None:
    K0, V0 = _pool(dtype, 9)
    q = _rand(B, NH, HD, dtype=dtype, seed=10)
    scale = HD ** -0.5
    want = K.decode_attn_ref(q, K0, V0, 1, B, POS, CTX, scale)
    got = K.decode_attn(q, K0, V0, 1, B, POS, CTX, scale)
    assert got.shape == (B, NH * HD) and got.dtype == dtype
    assert close(got, want, dtype)
    assert not close(K.decode_attn(q, K0, V0, 1, B, POS - 1, CTX, scale), want, dtype)  # one short: caught
    assert not close(K.decode_attn(q, K0, V0, 0, B, POS, CTX, scale), want, dtype)  # wrong layer: caught
    # A padded row parked past the bucket (the scratch position) attends to the whole bucket,
    # as the reference's mask does.
    far = torch.tensor([5, CAP - 1, 63])
    assert close(K.decode_attn(q, K0, V0, 1, B, far, CTX, scale), K.decode_attn_ref(q, K0, V0, 1, B, far, CTX, scale),
                 dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [2, 3, 4])
def test_decode_attn_split_kv(dtype, splits) -> None:
    """Split-KV: the context cut into 2, 3 (the last split empty: chunks of 32 over a bucket of 64)
    or 4 slices, partials reduced by the second kernel, equals the reference."""
    K0, V0 = _pool(dtype, 9)
    q = _rand(B, NH, HD, dtype=dtype, seed=10)
    scale = HD ** -0.5
    want = K.decode_attn_ref(q, K0, V0, 1, B, POS, CTX, scale)
    got = K.decode_attn(q, K0, V0, 1, B, POS, CTX, scale, splits=splits)
    assert got.shape == (B, NH * HD) and got.dtype == dtype
    assert close(got, want, dtype)
    assert not close(K.decode_attn(q, K0, V0, 1, B, POS - 1, CTX, scale, splits=splits), want, dtype)  # one short


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_reduction_both_ways(dtype) -> None:
    """The reduction across splits: the Triton kernel equals the torch reference over the same partials
    and the unsplit reference; reductions that are wrong in the ways split-KV goes wrong are caught."""
    K0, V0 = _pool(dtype, 13)
    q = _rand(B, NH, HD, dtype=dtype, seed=14)
    scale = HD ** -0.5
    want = K.decode_attn_ref(q, K0, V0, 1, B, POS, CTX, scale)
    m, lsum, acc = K.decode_attn_partials(q, K0, V0, 1, B, POS, CTX, scale, 4)
    assert m.shape == lsum.shape == (B, NH, 4) and acc.shape == (B, NH, 4, HD)
    assert torch.isinf(m[0, :, 1:]).all() and (lsum[0, :, 1:] == 0).all()  # pos 5: splits 1-3 are empty
    got = K.combine_splits(m, lsum, acc, dtype)
    assert close(got, want, dtype) and close(K.combine_splits_ref(m, lsum, acc, dtype), want, dtype)
    # Each split's max ignored (no rescaling to the common max): caught.
    assert not close(K.combine_splits(torch.zeros_like(m), lsum, acc, dtype), want, dtype)
    # The last split dropped (positions 48..63 of the row at 63 lost): caught.
    last = (m[..., :-1].contiguous(), lsum[..., :-1].contiguous(), acc[..., :-1, :].contiguous())
    assert not close(K.combine_splits(*last, dtype), want, dtype)


# The fused GEMVs round where torch does (the residual, the normed input, the GEMM output, RoPE's
# products, SwiGLU's activation), but in bf16 four roundings stack before an output: under the
# interpreter's truncating casts each may land an ulp off, so bf16 allows two kernel tolerances.
GEMV_TOL = {torch.float32: TOL[torch.float32], torch.bfloat16: 2 * TOL[torch.bfloat16]}


def gclose(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = GEMV_TOL[dtype]
    return bool(torch.allclose(got.float(), want.float(), rtol=tol, atol=tol))


def _gemv_case(dtype: torch.dtype, k: int = 80) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B rows of a residual stream, a delta, a norm weight; K = 80: two full K tiles of 32 and a ragged one."""
    x, d = _rand(B, k, dtype=dtype, seed=21), _rand(B, k, dtype=dtype, seed=22)
    ln = (1.0 + 0.1 * _rand(k, dtype=torch.float32, seed=23)).to(dtype)
    return x, d, ln


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_gu_silu(dtype) -> None:
    """The gate/up GEMV with add + RMSNorm before and SwiGLU after, against add_rmsnorm_ref, ``@`` and
    silu_mul_ref (inter 40: two full blocks of 16 pairs and a ragged one); with and without a delta;
    a wrong eps, a subtracted delta and gate/up swapped are caught."""
    inter = 40
    x, d, ln = _gemv_case(dtype)
    w = (_rand(2 * inter, x.shape[1], dtype=torch.float32, seed=24) * x.shape[1] ** -0.5).to(dtype)
    want, r_want = K.norm_gu_silu_ref(x, d, ln, EPS, w, inter)
    got, r = K.norm_gu_silu(x, d, ln, EPS, w, inter)
    assert got.shape == (B, inter) and r.shape == x.shape
    assert gclose(got, want, dtype) and close(r, r_want, dtype)
    assert r is not x and r.data_ptr() != d.data_ptr()  # the residual goes to a new buffer
    want0, _ = K.norm_gu_silu_ref(x, None, ln, EPS, w, inter)
    got0, r0 = K.norm_gu_silu(x, None, ln, EPS, w, inter)
    assert r0 is x and gclose(got0, want0, dtype)  # no delta: the residual is x itself
    assert not gclose(K.norm_gu_silu(x, d, ln, 0.3, w, inter)[0], want, dtype)  # eps perturbed
    assert not gclose(K.norm_gu_silu(x, -d, ln, EPS, w, inter)[0], want, dtype)  # delta subtracted
    swapped = torch.cat([w[inter:], w[:inter]]).contiguous()
    assert not gclose(K.norm_gu_silu(x, d, ln, EPS, swapped, inter)[0], want, dtype)  # gate and up swapped


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_qkv_rope(dtype) -> None:
    """The QKV GEMV with add + RMSNorm before and RoPE + the KV store after, against add_rmsnorm_ref,
    ``@`` and rope_store_ref: q, the residual, and the pool (only (layer 1, slot b, pos[b]) moves);
    RoPE the wrong way, a position off by one and the wrong layer are caught."""
    cos, sin = _tables(dtype)
    x, d, ln = _gemv_case(dtype, k=NH * HD + 16)
    w = (_rand((NH + 2 * NKV) * HD, x.shape[1], dtype=torch.float32, seed=25) * x.shape[1] ** -0.5).to(dtype)
    K0, V0 = _pool(dtype, 26)
    Kr, Vr, Kt, Vt = K0.clone(), V0.clone(), K0.clone(), V0.clone()
    q_want, r_want = K.norm_qkv_rope_ref(x, d, ln, EPS, w, cos, sin, POS, Kr, Vr, 1)
    q, r = K.norm_qkv_rope(x, d, ln, EPS, w, cos, sin, POS, Kt, Vt, 1)
    assert q.shape == (B, NH, HD)
    assert gclose(q, q_want, dtype) and close(r, r_want, dtype)
    assert gclose(Kt, Kr, dtype) and gclose(Vt, Vr, dtype)
    touched = torch.zeros(LAYERS, SLOTS, NKV, CAP, dtype=torch.bool)
    touched[1, torch.arange(B), :, POS] = True
    for pool, pool0 in ((Kt, K0), (Vt, V0)):
        assert torch.equal(pool[~touched], pool0[~touched]) and not torch.equal(pool[touched], pool0[touched])
    # The first layer: no delta, the residual is x.
    Kr0, Vr0, Kt0, Vt0 = K0.clone(), V0.clone(), K0.clone(), V0.clone()
    q0_want, _ = K.norm_qkv_rope_ref(x, None, ln, EPS, w, cos, sin, POS, Kr0, Vr0, 0)
    q0, r0 = K.norm_qkv_rope(x, None, ln, EPS, w, cos, sin, POS, Kt0, Vt0, 0)
    assert r0 is x and gclose(q0, q0_want, dtype) and gclose(Kt0, Kr0, dtype) and gclose(Vt0, Vr0, dtype)
    # Both ways.
    Kw, Vw = K0.clone(), V0.clone()
    q_bad, _ = K.norm_qkv_rope(x, d, ln, EPS, w, cos, -sin, POS, Kw, Vw, 1)  # rotated the wrong way
    assert not gclose(q_bad, q_want, dtype) and not gclose(Kw, Kr, dtype)
    Kw, Vw = K0.clone(), V0.clone()
    K.norm_qkv_rope(x, d, ln, EPS, w, cos, sin, POS + 1, Kw, Vw, 1)  # stored one position late
    assert not gclose(Kw, Kr, dtype) and not gclose(Vw, Vr, dtype)
    Kw, Vw = K0.clone(), V0.clone()
    K.norm_qkv_rope(x, d, ln, EPS, w, cos, sin, POS, Kw, Vw, 0)  # the wrong layer
    assert not gclose(Vw, Vr, dtype)


def test_split_count() -> None:
    # An H200 (132 SMs), 7B shape (32 kv heads): batch 1 at a 1024 bucket -> 5 splits (160 programs);
    # batch 4 -> 2; batch 16 fills the GPU alone; a short bucket caps the splits at 128 columns each.
    assert K.split_count(1, 32, 1024) == 5 and K.split_count(4, 32, 1024) == 2
    assert K.split_count(16, 32, 4096) == 1 and K.split_count(1, 32, 256) == 2 and K.split_count(1, 8, 64) == 1


def test_decode_attention_compiles_once_for_every_bucket(monkeypatch) -> None:
    """A server captures one decode graph per (batch, context) bucket. Triton compiles a kernel once per
    distinct set of constexprs and specialised ints, so decode attention's split count, chunk and context
    travel as runtime arguments it does not specialise on: every bucket of the 7B shape at batch 1-64
    launches the split kernel with one set of constexprs, and the reduction with at most three (before:
    one compile per bucket pair, 13 s of an H200 capture at each new max batch). Launches are recorded,
    not run; an int argument whose value moves between buckets must be one the kernel does not specialise."""
    consts: dict[str, set] = {}
    ints: dict[str, dict[str, set]] = {}

    class Rec:
        def __init__(self, fn) -> None:
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, **kw):
                name = self.fn.fn.__name__
                consts.setdefault(name, set()).add(tuple(sorted((k, str(v)) for k, v in kw.items())))
                for arg, v in zip(self.fn.arg_names, args, strict=False):  # the constexprs come as keywords
                    if isinstance(v, int):
                        ints.setdefault(name, {}).setdefault(arg, set()).add(v)
            return launch

    kernels = {n: getattr(K, n) for n in ("_decode_attn_split_kernel", "_attn_reduce_kernel", "_decode_attn_kernel")}
    for name, fn in kernels.items():
        patch_kernels(monkeypatch, K, name, Rec(fn))
    nh, nkv, hd, cap = 32, 8, 128, 4608  # 7b-peaked
    q = torch.empty(64, nh, hd)
    pool = torch.empty(1, 64, nkv, cap, hd)
    for b in range(1, 65):
        for ctx in (256, 512, 1024, 2048, 4096, cap):
            K.decode_attn(q[:b], pool, pool, 0, b, torch.zeros(b, dtype=torch.long), ctx, 1.0)
    assert len(consts["_decode_attn_split_kernel"]) == 1  # 1-16 rows split the context: one compile
    assert len(consts["_attn_reduce_kernel"]) <= 3
    assert len(consts["_decode_attn_kernel"]) == 1  # 17+ rows fill the GPU unsplit
    for name, fn in kernels.items():
        moving = {arg for arg, vs in ints[name].items() if len(vs) > 1}
        assert moving and moving <= set(fn.kwargs["do_not_specialize"]), (name, moving)


def test_get_ops() -> None:
    assert K.get_ops("torch").rmsnorm is K.rmsnorm_ref
    assert K.get_ops("triton").decode_attn is K.decode_attn
    assert K.get_ops("triton-gemv").rope_store is K.rope_store and K.get_ops("triton-gemv").name == "triton-gemv"
    assert K.get_ops("triton-mv").decode_attn is K.decode_attn and K.get_ops("triton-mv").name == "triton-mv"
    with pytest.raises(ValueError, match="unknown kernels"):
        K.get_ops("cuda-c")


# -- a Llama-shaped decode step, triton ops against torch ops ------------------------------------


HIDDEN, INTER, VOCAB = NH * HD, 96, 50


def _tiny_llama(dtype: torch.dtype) -> dict:
    """Random weights in FastModel's layout (fused qkv and gate/up), scaled like a trained model."""
    g = torch.Generator().manual_seed(11)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * shape[-1] ** -0.5).to(dtype)

    def ln() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(HIDDEN, generator=g)).to(dtype)

    layers = [{"ln1": ln(), "ln2": ln(), "qkv": w((NH + 2 * NKV) * HD, HIDDEN), "o": w(HIDDEN, NH * HD),
               "gu": w(2 * INTER, HIDDEN), "down": w(HIDDEN, INTER)} for _ in range(LAYERS)]
    return {"embed": torch.randn(VOCAB, HIDDEN, generator=g).to(dtype), "layers": layers, "norm": ln(),
            "lm_head": w(VOCAB, HIDDEN)}


def decode_step(ops, m: dict, tokens, pos, ctx, Kp, Vp, cos, sin):
    """FastModel.decode written against an Ops object: the shape of the future integration.

    The residual add of each sub-layer is fused with the norm that follows it (the next layer's
    ln1, or the final norm), which is the same arithmetic as FastModel's ``x = x + ...; _rms(x)``.
    """
    B_ = tokens.shape[0]
    x = m["embed"][tokens]
    h = ops.rmsnorm(x, m["layers"][0]["ln1"], EPS)
    for li, L in enumerate(m["layers"]):
        q = ops.rope_store(h @ L["qkv"].t(), cos, sin, pos, Kp, Vp, li)
        o = ops.decode_attn(q, Kp, Vp, li, B_, pos, ctx, HD ** -0.5)
        x, h = ops.add_rmsnorm(x, o @ L["o"].t(), L["ln2"], EPS)
        d = ops.silu_mul(h @ L["gu"].t(), INTER) @ L["down"].t()
        nxt = m["layers"][li + 1]["ln1"] if li + 1 < len(m["layers"]) else m["norm"]
        x, h = ops.add_rmsnorm(x, d, nxt, EPS)
    logits = (h @ m["lm_head"].t()).float()
    return logits, torch.argmax(logits, dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_step_triton_equals_torch(dtype) -> None:
    _step_equals_torch(dtype, decode_step, "triton")


def _step_equals_torch(dtype, step, kernels: str) -> None:
    """``step`` with ``kernels``' ops against decode_step with torch's: logits, greedy ids and the KV pool
    within 4x the per-kernel tolerance; both ways: the step with attention one position short fails it."""
    m = _tiny_llama(dtype)
    cos, sin = _tables(dtype)
    tokens = torch.tensor([3, 17, 42])
    K0, V0 = _pool(dtype, 12)  # a "prefilled" cache: everything before pos is some earlier prompt
    Kr, Vr, Kt, Vt = K0.clone(), V0.clone(), K0.clone(), V0.clone()
    want, want_ids = decode_step(K.get_ops("torch"), m, tokens, POS, CTX, Kr, Vr, cos, sin)
    got, got_ids = step(K.get_ops(kernels), m, tokens, POS, CTX, Kt, Vt, cos, sin)
    # Errors compound over two layers and three GEMMs on rounded inputs: 4x the per-kernel tolerance.
    tol = 4 * TOL[dtype]
    assert torch.allclose(got, want, rtol=tol, atol=tol), (got - want).abs().max()
    assert torch.equal(got_ids, want_ids)
    assert torch.allclose(Kt.float(), Kr.float(), rtol=tol, atol=tol)
    assert torch.allclose(Vt.float(), Vr.float(), rtol=tol, atol=tol)
    # Both ways: the same step with attention one position short is caught by the same check.
    Kb, Vb = K0.clone(), V0.clone()
    bad, _ = step(K.get_ops(kernels), m, tokens, POS - 1, CTX, Kb, Vb, cos, sin)
    assert not torch.allclose(bad, want, rtol=tol, atol=tol)


def decode_step_gemv(ops, m: dict, tokens, pos, ctx, Kp, Vp, cos, sin):
    """FastModel._decode_gemv written out: the QKV and gate/up GEMVs take the residual add + norm
    before them and RoPE + store / SwiGLU after them; attention, O and down as in decode_step."""
    B_ = tokens.shape[0]
    x, d = m["embed"][tokens], None
    for li, L in enumerate(m["layers"]):
        q, x = K.norm_qkv_rope(x, d, L["ln1"], EPS, L["qkv"], cos, sin, pos, Kp, Vp, li)
        o = ops.decode_attn(q, Kp, Vp, li, B_, pos, ctx, HD ** -0.5)
        act, x = K.norm_gu_silu(x, o @ L["o"].t(), L["ln2"], EPS, L["gu"], INTER)
        d = act @ L["down"].t()
    _, h = ops.add_rmsnorm(x, d, m["norm"], EPS)
    logits = (h @ m["lm_head"].t()).float()
    return logits, torch.argmax(logits, dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_step_gemv_equals_torch(dtype) -> None:
    """The 6-launch layer (fused GEMVs) against the torch step: logits, greedy ids, the KV pool; the
    same check catches the step with attention one position short."""
    _step_equals_torch(dtype, decode_step_gemv, "triton-gemv")


@pytest.mark.parametrize("epi", ["gu", "qkv"])
def test_gemv_gpu_launch_path(epi, monkeypatch) -> None:
    """The GPU's launch path (the autotuner over every config, the grid from the chosen BLOCK_N), run by
    the interpreter: each config is run once by the (stubbed) timing, the chosen one gives the answer.
    The CPU tests otherwise take the fixed-tile path, so this is what checks the GPU's call site."""
    tuned = K._norm_gemv2_tuned
    runs = []

    def bench(kernel_call, quantiles):  # stands in for do_bench: run once, rank configs in order tried
        kernel_call()
        runs.append(1)
        return [float(len(runs))] * len(quantiles or [0])

    patch_kernels(monkeypatch, K, "_autotuned", lambda device: True)
    monkeypatch.setitem(tuned.__dict__, "do_bench", bench)  # a cached_property: the instance's own value
    monkeypatch.setattr(tuned, "cache", {})
    dtype = torch.bfloat16
    x, d, ln = _gemv_case(dtype, k=NH * HD + 16)
    if epi == "gu":
        w = (_rand(2 * 40, x.shape[1], dtype=torch.float32, seed=24) * x.shape[1] ** -0.5).to(dtype)
        got, want = K.norm_gu_silu(x, d, ln, EPS, w, 40)[0], K.norm_gu_silu_ref(x, d, ln, EPS, w, 40)[0]
    else:
        cos, sin = _tables(dtype)
        w = (_rand((NH + 2 * NKV) * HD, x.shape[1], dtype=torch.float32, seed=25) * x.shape[1] ** -0.5).to(dtype)
        K0, V0 = _pool(dtype, 26)
        got = K.norm_qkv_rope(x, d, ln, EPS, w, cos, sin, POS, K0.clone(), V0.clone(), 1)[0]
        want = K.norm_qkv_rope_ref(x, d, ln, EPS, w, cos, sin, POS, K0.clone(), V0.clone(), 1)[0]
    assert len(runs) == len(K._GEMV_CONFIGS) and len(tuned.cache) == 1
    assert gclose(got, want, dtype)


def test_gemv_compiles_for_the_h200() -> None:
    """benchmarks/gpu/compile_check.py: every autotune config of the fused GEMV, both epilogues, with and
    without the delta, compiles for sm_90 with Triton's own ptxas, without spills, within an SM's shared
    memory, its weight loads pipelined (cp.async). Run in a subprocess: compiled, not interpreted."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "compile_check.py"
    if not (Path(K.triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("triton without its NVIDIA backend's ptxas")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=tree_env())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"{4 * len(K._GEMV_CONFIGS)} of {4 * len(K._GEMV_CONFIGS)} configs compile" in res.stdout


def test_launches_per_layer() -> None:
    """benchmarks/gpu/count_launches.py on the CPU: a decode step's kernels per layer with split-KV at 8
    splits (the H200's plan at batch 1, bucket 1024): 10 with kernels="triton", 6 with "triton-gemv"
    (the two fused GEMVs, attention's two launches, the O and down GEMMs); 5 per step besides."""
    import count_launches

    with pytest.MonkeyPatch.context() as mp:
        patch_kernels(mp, K, "decode_attn", K.decode_attn)  # count_launches pins the splits by rebinding these
        patch_kernels(mp, K, "_OPS", dict(K._OPS))
        res = count_launches.main(["--splits", "8", "--kernels", "triton", "triton-gemv"])
    assert (res["triton"]["per_layer"], res["triton"]["fixed"]) == (10, 5)
    assert (res["triton-gemv"]["per_layer"], res["triton-gemv"]["fixed"]) == (6, 5)
    assert res["triton-gemv"]["layer_ops"] == {"triton.norm_gemv2_kernel": 2, "triton.decode_attn_split_kernel": 1,
                                               "triton.attn_reduce_kernel": 1, "aten.matmul": 2}


# -- engine step 7: the plain GEMV behind --kernels triton-mv --------------------------------------

MV_SHAPES = {"ragged": (37, 600), "even": (32, 1024)}  # N, K off and on whole tiles (the masks / unmasked)


def _mv_case(dtype: torch.dtype, n: int, k: int, m: int = 1, seed: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    x = _rand(m, k, dtype=dtype, seed=seed)
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(seed + 1)) * k ** -0.5).to(dtype)
    return x, w


@pytest.mark.parametrize("dtype", DTYPES)
def test_mv_gemv_every_config_equals_matmul(dtype) -> None:
    """Each config of MV_CONFIGS (the five 7B shapes' launch configurations) and MV_DEFAULT computes
    x @ w.t() at one row, on a ragged and an even tiny shape; both ways: the same config run one K
    tile short (as gemv_bench's skip_k_tile) is caught by the same check."""
    for name, (n, k) in MV_SHAPES.items():
        x, w = _mv_case(dtype, n, k)
        want = K.mv_linear_ref(x, w)
        for cfg in [*K.MV_CONFIGS.values(), K.MV_DEFAULT]:
            got = K.mv_gemv(x, w, cfg)
            assert got.shape == (1, n) and got.dtype == dtype
            assert close(got, want, dtype), (name, cfg.label(), (got.float() - want.float()).abs().max())
            assert not close(K.mv_gemv(x, w, cfg, nt_short=1), want, dtype), (name, cfg.label())


def test_mv_linear_picks_the_table_and_falls_back() -> None:
    """mv_linear at one row launches mv_gemv with the table's config for a listed (N, K) and MV_DEFAULT
    elsewhere (bit for bit mv_gemv's output); more rows than MV_MAX_ROWS or a non-contiguous x fall back
    to x @ w.t() exactly, without a launch."""
    x, w = _mv_case(torch.bfloat16, *MV_SHAPES["ragged"])
    assert torch.equal(K.mv_linear(x, w), K.mv_gemv(x, w, K.MV_DEFAULT))
    seen = []
    real = K.mv_gemv
    with pytest.MonkeyPatch.context() as mp:
        patch_kernels(mp, K, "mv_gemv", lambda x_, w_, cfg, **kw: seen.append(cfg) or real(x_, w_, cfg, **kw))
        x2, _ = _mv_case(torch.bfloat16, *MV_SHAPES["ragged"], m=K.MV_MAX_ROWS + 1)
        assert torch.equal(K.mv_linear(x2, w), x2 @ w.t())
        xs = _rand(600, 2, dtype=torch.bfloat16, seed=3).t()[:1]  # [1, 600], stride 2 along K
        assert torch.equal(K.mv_linear(xs, w), xs @ w.t())
        assert not seen
        K.mv_linear(x, w)
        assert seen == [K.MV_DEFAULT]  # the spy sees a launch: the fallbacks above were real fallbacks
        qkv_cfg = K.MV_CONFIGS[(6144, 4096)]
        mp.setitem(K.MV_CONFIGS, MV_SHAPES["ragged"], qkv_cfg)  # this shape listed: its config is used
        K.mv_linear(x, w)
        assert seen == [K.MV_DEFAULT, qkv_cfg] and qkv_cfg != K.MV_DEFAULT


def test_mv_configs_are_the_measured_winners() -> None:
    """MV_CONFIGS holds, per 7B shape, the config gemv_bench found fastest at M=1 on the H200
    (results/gemv_2026-12-03h.json), each of which beat cuBLAS there."""
    import json

    res = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "results"
                      / "gemv_2026-12-03h.json").read_text())
    best = {(r["N"], r["K"]): r for r in res["cases"] if r["M"] == 1}
    assert set(K.MV_CONFIGS) == set(best) and K.MV_MAX_ROWS == 1
    for key, cfg in K.MV_CONFIGS.items():
        assert cfg.label() == best[key]["best_label"]
        assert best[key]["triton_graph_us"] < best[key]["linear_graph_us"]


def test_mv_configs_compile_for_the_h200() -> None:
    """benchmarks/gpu/compile_check.py --mv: the five table configs at their 7B shapes and MV_DEFAULT at
    a masked shape compile for sm_90 (Triton's ptxas) through the JIT's warm-up path: no spills, shared
    memory within an SM, cp.async where STAGES > 1. A subprocess: compiled, not interpreted."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "compile_check.py"
    if not (Path(K.triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("triton without its NVIDIA backend's ptxas")
    res = subprocess.run([sys.executable, str(script), "--mv"], capture_output=True, text=True, timeout=300,
                         env=tree_env())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "6 of 6 triton-mv configs compile for sm_90 cleanly" in res.stdout


PDL_TOY = """
import triton
import triton.language as tl


@triton.jit
def racy(X, Y, PDL: tl.constexpr):  # reads X before it waits: what compile_check.py --pdl must catch
    x = tl.load(X + tl.arange(0, 128))
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(Y + tl.arange(0, 128), x)
"""


def test_pdl_kernels_wait_before_they_touch_memory(tmp_path) -> None:
    """benchmarks/gpu/compile_check.py --pdl: every kernel --pdl on launches, compiled for sm_90 as launched (PDL,
    launch_pdl; the tables' 64-row configs, the GEMV's at one row), waits (griddepcontrol.wait) before any global
    load, store or async copy, lets the next kernel launch (launch_dependents), and the GEMMs and GEMVs prefetch
    weights into L2 before the wait. Both ways: a kernel that loads before its wait is caught by the same check
    (pdl_order). Compiled, not interpreted: subprocesses."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "compile_check.py"
    if not (Path(K.triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("triton without its NVIDIA backend's ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env = tree_env(env, str(tmp_path), str(script.parent))  # a toy kernel, the scripts beside compile_check.py
    res = subprocess.run([sys.executable, str(script), "--pdl"], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "17 of 17 --pdl kernels wait before they touch memory (sm_90)" in res.stdout, res.stdout[-2000:]
    (tmp_path / "pdl_toy.py").write_text(PDL_TOY)
    code = """
import json
import torch, compile_check as C, gemv_bench as G, pdl_toy
from triton.runtime.driver import driver
driver.set_active(G._AOTDriver(90))
ck = pdl_toy.racy.warmup(torch.float32, torch.float32, PDL=True, launch_pdl=True, grid=(1,))
r = dict(C.pdl_order(ck.asm["ptx"]), kernel="racy", launch_pdl=True)
print("racy", json.dumps(r), C.pdl_problems([r]))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "memory instruction(s) before griddepcontrol.wait" in res.stdout, res.stdout[-2000:]
    assert '"before_wait": 0' not in res.stdout and '"wait": true' in res.stdout, res.stdout[-2000:]


# -- batch 16..64: the skinny GEMM (mm_gemm / mm_linear) and decode attention's launch table ----------------
# -- batch 16..64: the skinny GEMM (mm_gemm / mm_linear) and decode attention's launch table ----------------

MM_CFGS = (K.MmCfg(16, 64, 4, 2), K.MmCfg(32, 32, 4, 3, 4, True, ""), K.MmCfg(16, 32, 8, 1, 2, False))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_gemm_equals_matmul(dtype) -> None:
    """The skinny GEMM at a ragged N (40: a short last N tile) and K (320: a short last K tile), 20 rows
    (a masked 32-row tile) and 64 rows, one split and split-K 2 and 4 (float32 partials, fixed-order
    reduction), both dot orientations, equals x @ w.t(); both ways: one K tile short is caught."""
    for m in (20, 64):
        x, w = _mv_case(dtype, 40, 320, m=m, seed=60)
        want = K.mm_linear_ref(x, w)
        for cfg in MM_CFGS:
            got = K.mm_gemm(x, w, cfg)
            assert got.shape == (m, 40) and got.dtype == dtype
            assert close(got, want, dtype), (m, cfg.label(), (got.float() - want.float()).abs().max())
            assert not close(K.mm_gemm(x, w, cfg, nt_short=1), want, dtype), (m, cfg.label())


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_gemm_glu_is_gemm_then_silu_mul(dtype) -> None:
    """GLU: the gate/up GEMM with SwiGLU in its epilogue, at a ragged INTER (40) and K (320), 20 and 64 rows,
    both dot orientations, equals mm_gemm then silu_mul at the same rounding points (triton_interp.same_rounding) and the exact
    (float64) SwiGLU within the tolerance; both ways: one K tile short is caught. mm_glu_linear launches it only for a
    listed shape of 2..64 rows (None otherwise: the caller's two launches)."""
    inter = 40
    for m in (20, 64):
        x, w = _mv_case(dtype, 2 * inter, 320, m=m, seed=61)
        gu = x.double() @ w.double().t()  # exact: torch's bf16 CPU GEMM and silu round elsewhere than the kernels
        want = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(dtype)
        for cfg in (K.MmCfg(16, 64, 4, 2), K.MmCfg(32, 32, 4, 3, 1, True, ""), K.MmCfg(16, 32, 8, 1)):
            got = K.mm_gemm(x, w, cfg, glu=inter)
            assert got.shape == (m, inter) and got.dtype == dtype
            assert same_rounding(got, K.silu_mul(K.mm_gemm(x, w, cfg), inter)), (m, cfg.label())
            assert close(got, want, dtype), (m, cfg.label(), (got.float() - want.float()).abs().max())
            assert not close(K.mm_gemm(x, w, cfg, glu=inter, nt_short=1), want, dtype), (m, cfg.label())
    cfg = K.MmCfg(16, 64, 4, 2)
    with pytest.MonkeyPatch.context() as mp:
        patch_kernels(mp, K, "MM_GLU_CONFIGS", {(64, 2 * inter, 320): cfg})
        assert torch.equal(K.mm_glu_linear(x, w, inter), K.mm_gemm(x, w, cfg, glu=inter))
        assert K.mm_glu_linear(x[:20], w, inter) is None  # the 32-row bucket is not listed
        assert K.mm_glu_linear(x[:1], w, inter) is None  # one row: the GEMV's
        assert K.mm_glu_linear(x, w[:-1], inter) is None  # not [gate; up] of 2 x INTER rows
    with pytest.raises(AssertionError, match="GLU"):
        K.mm_gemm(x, w, K.MmCfg(16, 64, 4, 2, 2), glu=inter)  # split-K has no SwiGLU epilogue


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_gemm_norm_is_rmsnorm_then_gemm(dtype) -> None:
    """NORM (--mm-norm): the GEMM of the residual stream x with RMSNorm(x) * ln in its prologue, at a ragged N (40)
    and K (320), 20 and 64 rows, both dot orientations, with and without GLU: the exact (float64) rmsnorm-then-GEMM
    within the tolerance, and the two launches (rmsnorm, mm_gemm) within one rounding of the output (with GLU: no
    further from the exact SwiGLU than they are); both ways: one K tile short, or the
    norm's weight or its scale left out, is caught. Split-K has no NORM."""
    n, k, eps, inter = 40, 320, 1e-5, 40
    ln = (1.0 + 0.5 * torch.randn(k, generator=torch.Generator().manual_seed(7))).to(dtype)
    for m in (20, 64):
        x, w = _mv_case(dtype, 2 * n, k, m=m, seed=71)
        x = x * 3.0  # rows whose rms is far from 1: a missing scale shows
        xd = x.double()
        h = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * ln.double()
        want = (h @ w.double().t()).to(dtype)
        gu = h @ w.double().t()
        want_glu = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        for cfg in (K.MmCfg(16, 64, 4, 2), K.MmCfg(32, 32, 4, 3, 1, True, ""), K.MmCfg(16, 32, 8, 1)):
            got = K.mm_gemm(x, w, cfg, norm=(ln, eps))
            assert got.shape == (m, 2 * n) and got.dtype == dtype
            assert close(got, want, dtype), (m, cfg.label(), (got.float() - want.float()).abs().max())
            two = K.mm_gemm(K.rmsnorm(x, ln, eps), w, cfg)
            assert close(got, two, dtype), (m, cfg.label())
            # with GLU (SwiGLU's three roundings magnify a one-ulp difference): no further from the exact SwiGLU than
            # the two launches (rmsnorm, then the GLU launch) are
            err = (K.mm_gemm(x, w, cfg, glu=inter, norm=(ln, eps)).double() - want_glu).abs().max()
            two_err = (K.mm_gemm(K.rmsnorm(x, ln, eps), w, cfg, glu=inter).double() - want_glu).abs().max()
            assert err <= 1.25 * two_err + TOL[dtype] ** 2, (m, cfg.label(), err, two_err)
            assert not close(K.mm_gemm(x, w, cfg, norm=(ln, eps), nt_short=1), want, dtype), (m, cfg.label())
            assert not close(K.mm_gemm(x, w, cfg, norm=(torch.ones_like(ln), eps)), want, dtype)  # ln left out
            assert not close(K.mm_gemm(x, w, cfg), want, dtype)  # the scale left out
    with pytest.raises(AssertionError, match="NORM"):
        K.mm_gemm(x, w, K.MmCfg(16, 64, 4, 2, 2), norm=(ln, eps))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_gemm_res_is_the_residual_add(dtype) -> None:
    """RES (--mm-norm): ``res + x @ w.T`` written into res, in the epilogue (one split) or in split-K's reduction,
    both orientations, 20 and 64 rows: bit for bit add_rmsnorm's residual (today's add of mm_gemm's rounded output),
    in place; both ways: one
    K tile short is caught. mm_res_linear (mm_norm_linear) launches it only where MM_FUSE_CONFIGS lists ("res" or
    "norm", the shape), a split one never for "norm" (None otherwise, res untouched)."""
    for m in (20, 64):
        x, w = _mv_case(dtype, 40, 320, m=m, seed=81)
        r0 = _rand(m, 40, dtype=dtype, seed=83)
        ones = torch.ones(40, dtype=dtype)
        for cfg in MM_CFGS:
            want = K.add_rmsnorm(r0, K.mm_gemm(x, w, cfg), ones, 1e-5)[0]  # today's residual add (its own launch)
            r = r0.clone()
            got = K.mm_gemm(x, w, cfg, res=r)
            assert got.data_ptr() == r.data_ptr() and torch.equal(r, want), (m, cfg.label())
            assert not close(K.mm_gemm(x, w, cfg, res=r0.clone(), nt_short=1), want, dtype), (m, cfg.label())
    cfg = K.MmCfg(16, 64, 4, 2)
    with pytest.MonkeyPatch.context() as mp:
        patch_kernels(mp, K, "MM_FUSE_CONFIGS", {("res", 64, 40, 320): cfg, ("res", 32, 40, 320): K.MmCfg(32, 32, 4, 3, 2),
                                          ("norm", 64, 40, 320): cfg, ("norm", 32, 40, 320): K.MmCfg(32, 32, 4, 3, 2)})
        r = r0.clone()
        assert torch.equal(K.mm_res_linear(x, w, r), K.mm_gemm(x, w, cfg, res=r0.clone()))
        r = r0[:20].clone()
        assert torch.equal(K.mm_res_linear(x[:20], w, r), K.mm_gemm(x[:20], w, K.MmCfg(32, 32, 4, 3, 2), res=r0[:20].clone()))
        r = r0[:1].clone()
        assert K.mm_res_linear(x[:1], w, r) is None and torch.equal(r, r0[:1])  # one row: the GEMV's
        ln = torch.ones(320, dtype=dtype)
        assert torch.equal(K.mm_norm_linear(x, ln, 1e-5, w), K.mm_gemm(x, w, cfg, norm=(ln, 1e-5)))
        assert K.mm_norm_linear(x[:20], ln, 1e-5, w) is None  # the 32-row launch is split: no NORM
        assert K.mm_norm_linear(x, ln, 1e-5, w[:, :-1]) is None  # an unlisted shape
        assert K.mm_norm_linear(x[:16], ln, 1e-5, w) is None  # an unlisted row bucket
        assert K.mm_glu_linear(x, w, 20, norm=(ln, 1e-5)) is None  # no ("glu_norm", ...) entry


def test_mm_linear_falls_back_unless_listed() -> None:
    """mm_linear is exactly x @ w.t(), without a launch, for an empty MM_CONFIGS, an
    unlisted shape or row bucket, and more rows than 64; a listed (row bucket, N, K) launches mm_gemm
    with its config (bit for bit mm_gemm's output)."""
    assert [K.mm_rows(m) for m in (1, 16, 17, 32, 33, 64, 65)] == [16, 16, 32, 32, 64, 64, 0]
    assert all(k[1:] in {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (32000, 4096)}
               for k in K.MM_CONFIGS)  # the H200 table lists the 7B's shapes only
    x, w = _mv_case(torch.bfloat16, 40, 320, m=20, seed=61)
    seen = []
    real = K.mm_gemm
    with pytest.MonkeyPatch.context() as mp:
        patch_kernels(mp, K, "MM_CONFIGS", {})
        patch_kernels(mp, K, "mm_gemm", lambda x_, w_, cfg, **kw: seen.append(cfg) or real(x_, w_, cfg, **kw))
        assert torch.equal(K.mm_linear(x, w), x @ w.t())  # empty table
        cfg = MM_CFGS[1]
        mp.setitem(K.MM_CONFIGS, (32, 40, 320), cfg)
        x16, _ = _mv_case(torch.bfloat16, 40, 320, m=16, seed=62)
        w2 = w[:32].contiguous()
        x80, _ = _mv_case(torch.bfloat16, 40, 320, m=80, seed=63)
        for xx, ww in ((x16, w), (x, w2), (x80, w)):  # row bucket 16, N 32, 80 rows: not listed
            assert torch.equal(K.mm_linear(xx, ww), xx @ ww.t())
        assert not seen
        assert torch.equal(K.mm_linear(x, w), real(x, w, cfg))  # listed: the spy sees the launch
        assert seen == [cfg]


@pytest.mark.parametrize("cfg", [K.AttnCfg(1, 16, 2, 3), K.AttnCfg(3, 16, 8, 1), K.AttnCfg(2, 32, 4, 4),
                                 K.AttnCfg(1, 32, 4, 2, True), K.AttnCfg(4, 16, 4, 2, True)])
def test_decode_attn_launch_config(cfg, monkeypatch) -> None:
    """decode_attn with a non-default AttnCfg (unsplit and split, other BLOCK_N, warps, stages, bf16 dots: here
    their arithmetic in float32 dots, LOWP 2, the interpreter having no bf16 dot) equals the
    reference, given directly or looked up in ATTN_CONFIGS by (batch, context bucket); both ways: one
    position short is caught. ATTN_CONFIGS ships empty: today's launch (AttnCfg())."""
    assert K.ATTN_CONFIGS == {} and K.attn_config(64, 1024) == K.AttnCfg()
    dtype = torch.bfloat16
    K0, V0 = _pool(dtype, 70)
    q = _rand(B, NH, HD, dtype=dtype, seed=71)
    scale = HD ** -0.5
    want = K.decode_attn_ref(q, K0, V0, 1, B, POS, CTX, scale)
    assert close(K.decode_attn(q, K0, V0, 1, B, POS, CTX, scale, cfg=cfg), want, dtype)
    assert not close(K.decode_attn(q, K0, V0, 1, B, POS - 1, CTX, scale, cfg=cfg), want, dtype)
    seen = []
    real = K.decode_attn_partials
    patch_kernels(monkeypatch, K, "decode_attn_partials", lambda *a: seen.append(a[-2:]) or real(*a))
    monkeypatch.setitem(K.ATTN_CONFIGS, (B, CTX), cfg)
    assert close(K.decode_attn(q, K0, V0, 1, B, POS, CTX, scale), want, dtype)
    assert seen == ([] if cfg.splits == 1 else [(cfg.splits, cfg)])


def test_attention_launch_modes_per_device_and_pool() -> None:
    """AttnCfg.lowp_mode: float32 dots without lowp or for float32 q; bf16 MMA (1) on the GPU, its interpreted
    twin (2) on the CPU; over an fp8 pool on the GPU, LOWP 3 (tiles widened in registers) only with reg=True."""
    from types import SimpleNamespace as NS

    cuda_q, cpu_q = NS(dtype=torch.bfloat16, is_cuda=True), NS(dtype=torch.bfloat16, is_cuda=False)
    fp8, bf16 = NS(dtype=torch.float8_e4m3fn), NS(dtype=torch.bfloat16)
    lp, reg = K.AttnCfg(lowp=True), K.AttnCfg(lowp=True, reg=True)
    assert K.AttnCfg().lowp_mode(cuda_q, fp8) == 0 and lp.lowp_mode(NS(dtype=torch.float32, is_cuda=True)) == 0
    assert lp.lowp_mode(cuda_q, fp8) == lp.lowp_mode(cuda_q, bf16) == reg.lowp_mode(cuda_q, bf16) == 1
    assert reg.lowp_mode(cuda_q, fp8) == 3 and reg.lowp_mode(cpu_q, fp8) == 2 and reg.label().endswith("br")
    # --decode-attn lowp-reg: lowp's launch (the table's, else the default) with reg on; lowp's without it
    for B, ctx in [(64, 1024), (4, 1024), (2, 512)]:
        lo, lr = K.decode_attn_config("lowp", B, ctx), K.decode_attn_config("lowp-reg", B, ctx)
        assert lo.lowp and not lo.reg and lr == K.replace(lo, reg=True)
        # over an fp8 pool: ATTN_LOWP_FP8's launch where it lists the bucket, lowp's elsewhere
        assert K.decode_attn_config("lowp", B, ctx, kv_fp8=True) == K.ATTN_LOWP_FP8.get((B, ctx), lo)


def test_an_fp8_pool_takes_its_own_launch_table(monkeypatch) -> None:
    """ATTN_LOWP_FP8 lists an fp8 pool's launch per bucket: --decode-attn lowp/lowp-reg over an fp8 pool take it
    there, a bf16 pool and other buckets keep ATTN_LOWP's."""
    fp8cfg = K.AttnCfg(1, 64, 4, 1, True, True)
    monkeypatch.setitem(K.ATTN_LOWP_FP8, (64, 1024), fp8cfg)
    assert K.decode_attn_config("lowp", 64, 1024, kv_fp8=True) == fp8cfg
    assert K.decode_attn_config("lowp-reg", 64, 1024, kv_fp8=True) == fp8cfg
    assert K.decode_attn_config("lowp", 64, 1024) == K.ATTN_LOWP[(64, 1024)]
    assert (2, 512) not in K.ATTN_LOWP_FP8 and K.decode_attn_config("lowp", 2, 512, kv_fp8=True) == K.ATTN_LOWP_DEFAULT
    assert K.decode_attn_config("lowp", 4, 1024) == K.ATTN_LOWP[(4, 1024)] != K.ATTN_LOWP_FP8[(4, 1024)]
    assert K.decode_attn_config("default", 64, 1024, kv_fp8=True) == K.attn_config(64, 1024)
