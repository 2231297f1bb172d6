"""GEMV: the fused GEMVs of ``--kernels triton-gemv`` (``norm_qkv_rope``, ``norm_gu_silu``: add + norm before,
RoPE + KV store or SwiGLU after) and the plain GEMV of ``--kernels triton-mv`` (``mv_linear``) with its launch table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops need no triton
    triton = None

from .launch import (  # noqa: F401
    HAVE_TRITON,
    _add,
    _fmax,
    _interpreting,
    _into,
    _kv_emu,
    _need_triton,
    _pdl,
    _pdl_wait,
    _prefetch_w,
)
from .norms import add_rmsnorm_ref, rmsnorm_ref, silu_mul_ref
from .rope import _kv_cast, rope_store_ref  # noqa: F401

if HAVE_TRITON:
    @triton.jit(do_not_specialize=["M"])
    def _norm_gemv2_kernel(X, D, LNW, R, W, OUT, COS, SIN, POS, KL, VL, M, K, N2, eps,
                           s_x, s_d, s_r, s_o, s_oh, s_cos, s_kb, s_kh, s_kp,
                           HALF: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HAS_DELTA: tl.constexpr,
                           EPI: tl.constexpr, F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, KV_EMU: tl.constexpr = False):
        # A decode-step GEMV (M <= BLOCK_M rows) with the norm before it and the elementwise work after
        # it fused in, so one launch replaces three:
        #   prologue: r = x + d (rounded; program 0 stores it), a = rmsnorm(r) * lnw (each program
        #             gathers the row statistics itself, from the K values it streams anyway);
        #   GEMM:     two accumulators per program, rows row_a(j) and row_b(j) of W for its BLOCK_N pairs j;
        #   EPI 1:    SwiGLU: row_a = j (gate), row_b = N2 + j (up); OUT[m, j] = silu(gate) * up;
        #   EPI 2:    RoPE + KV store: pair j = (head, d < HALF), row_a = head * 2 * HALF + d, row_b = row_a
        #             + HALF (the rotate-half partners); q heads rotated into OUT [M, nh, hd], k heads rotated
        #             and v heads copied into the pool at (slot m, POS[m]) — rope_store_ref's arithmetic.
        # Each accumulator is rounded to the model dtype first, as torch's ``h @ W.t()`` output is.
        pid = tl.program_id(0)
        j = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        jm = j < N2
        if EPI == 2:
            head = j // HALF
            d = j % HALF
            row_a = head * (2 * HALF) + d
            row_b = row_a + HALF
        else:
            row_a = j
            row_b = j + N2
        rm = tl.arange(0, BLOCK_M)
        mm = rm < M
        rm64 = rm.to(tl.int64)
        kk = tl.arange(0, BLOCK_K)
        dt = X.dtype.element_ty
        # One pass over K. RMSNorm's scale is per row, so it commutes with the GEMM:
        #   (r * rstd * lnw) @ W.T = rstd * ((r * lnw) @ W.T),
        # and the sum of squares is gathered in the same loop as the GEMM; the accumulators are
        # scaled by rstd at the end (in float32: one bf16 rounding of the GEMM input fewer than
        # add_rmsnorm_ref's, which rounds r * rstd and then its product with lnw). The small operands
        # of the next K tile are loaded one iteration ahead (their L2 latency hidden behind this
        # tile); the weights are what the compiler's pipeliner (num_stages) streams.
        wa_ptr = W + row_a.to(tl.int64)[:, None] * K
        wb_ptr = W + row_b.to(tl.int64)[:, None] * K
        acc_a = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        acc_b = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        ss = tl.full([BLOCK_M], 0.0, tl.float32)
        msk = mm[:, None] & (kk < K)[None, :]
        xn = tl.load(X + rm64[:, None] * s_x + kk[None, :], mask=msk, other=0.0).to(tl.float32)
        if HAS_DELTA:
            # The residual is rounded to the model dtype first, as ``x + delta`` is in torch.
            xn = (xn + tl.load(D + rm64[:, None] * s_d + kk[None, :], mask=msk, other=0.0).to(tl.float32)).to(dt)
        ln = tl.load(LNW + kk, mask=kk < K, other=0.0)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + kk
            km = ks < K
            x = xn
            lw = ln.to(tl.float32)
            nks = ks + BLOCK_K
            nmsk = mm[:, None] & (nks < K)[None, :]
            xn = tl.load(X + rm64[:, None] * s_x + nks[None, :], mask=nmsk, other=0.0).to(tl.float32)
            if HAS_DELTA:
                xn = (xn + tl.load(D + rm64[:, None] * s_d + nks[None, :], mask=nmsk,
                                   other=0.0).to(tl.float32)).to(dt)
            ln = tl.load(LNW + nks, mask=nks < K, other=0.0)
            if HAS_DELTA:  # program 0 writes the residual stream
                tl.store(R + rm64[:, None] * s_r + ks[None, :], x, mask=mm[:, None] & km[None, :] & (pid == 0))
            xf = x.to(tl.float32)
            ss += tl.reduce(xf * xf, 1, _add)
            a = (xf * lw[None, :]).to(dt)
            wm = jm[:, None] & km[None, :]
            wa = tl.load(wa_ptr + ks[None, :], mask=wm, other=0.0)
            wb = tl.load(wb_ptr + ks[None, :], mask=wm, other=0.0)
            if F32:  # the CPU interpreter (and float32 models): exact float32 products
                a = a.to(tl.float32)
                acc_a += tl.dot(a, tl.trans(wa.to(tl.float32)), input_precision="ieee")
                acc_b += tl.dot(a, tl.trans(wb.to(tl.float32)), input_precision="ieee")
            else:  # bf16/fp16 tensor cores, float32 accumulation (products exact, as cuBLAS's)
                acc_a += tl.dot(a, tl.trans(wa))
                acc_b += tl.dot(a, tl.trans(wb))
        rstd = 1.0 / tl.sqrt(ss / K + eps)
        acc_a = acc_a * rstd[:, None]
        acc_b = acc_b * rstd[:, None]
        ga = acc_a.to(dt).to(tl.float32)
        gb = acc_b.to(dt).to(tl.float32)
        om = mm[:, None] & jm[None, :]
        if EPI == 1:
            act = (ga / (1.0 + tl.exp(-ga))).to(dt).to(tl.float32)
            tl.store(OUT + rm64[:, None] * s_o + j[None, :], (act * gb).to(dt), mask=om)
        else:
            p = tl.load(POS + rm, mask=mm, other=0).to(tl.int64)
            crow = p[:, None] * s_cos
            ca = tl.load(COS + crow + d[None, :], mask=om, other=0.0).to(tl.float32)
            sa = tl.load(SIN + crow + d[None, :], mask=om, other=0.0).to(tl.float32)
            cb = tl.load(COS + crow + (d + HALF)[None, :], mask=om, other=0.0).to(tl.float32)
            sb = tl.load(SIN + crow + (d + HALF)[None, :], mask=om, other=0.0).to(tl.float32)
            ya = ((ga * ca).to(dt).to(tl.float32) - (gb * sa).to(dt).to(tl.float32)).to(dt)
            yb = ((gb * cb).to(dt).to(tl.float32) + (ga * sb).to(dt).to(tl.float32)).to(dt)
            is_q = head < NH
            is_k = (head >= NH) & (head < NH + NKV)
            is_v = head >= NH + NKV
            h64 = head.to(tl.int64)
            qoff = rm64[:, None] * s_o + h64[None, :] * s_oh + d[None, :]
            qm = om & is_q[None, :]
            tl.store(OUT + qoff, ya, mask=qm)
            tl.store(OUT + qoff + HALF, yb, mask=qm)
            kh = tl.where(is_k, h64 - NH, h64 - NH - NKV)
            koff = rm64[:, None] * s_kb + kh[None, :] * s_kh + p[:, None] * s_kp + d[None, :]
            km2 = om & is_k[None, :]
            kdt = KL.dtype.element_ty  # the pool's dtype: bf16, or fp8 (scale 1; _kv_cast)
            tl.store(KL + koff, _kv_cast(ya, kdt, KV_EMU), mask=km2)
            tl.store(KL + koff + HALF, _kv_cast(yb, kdt, KV_EMU), mask=km2)
            vm = om & is_v[None, :]
            tl.store(VL + koff, _kv_cast(ga.to(dt), kdt, KV_EMU), mask=vm)
            tl.store(VL + koff + HALF, _kv_cast(gb.to(dt), kdt, KV_EMU), mask=vm)

    # On the GPU the tile sizes are picked per (N2, K) by timing these at the first call (a warm-up
    # before any graph capture: FastEngine's start-up, GraphDecoder's two eager steps); each program
    # streams 2 x BLOCK_N rows of W. 8 configs x 2 GEMVs: ~16 compiles (< 1 s each for sm_90 on a
    # laptop-class CPU, checked ahead of time) and ~0.2 s of timing each, once per process.
    _GEMV_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st)
                     for bn, bk, w, st in ((16, 128, 4, 6), (16, 256, 4, 4), (16, 512, 4, 3), (32, 128, 4, 4),
                                           (32, 256, 4, 3), (64, 128, 8, 3), (16, 256, 8, 4), (32, 128, 8, 5))]
    _norm_gemv2_tuned = triton.autotune(configs=_GEMV_CONFIGS, key=["N2", "K", "EPI"])(_norm_gemv2_kernel)

    # -- GEMV (``--kernels triton-mv``): a plain GEMV, y = x @ W.T, W [N, K] row-major ---------
    # Moved here from benchmarks/gpu/gemv_bench.py (which imports them back and tunes them): one program
    # per BLOCK_N rows of W (and per K split); each streams [BLOCK_N, BLOCK_K] tiles of W along K
    # (16-byte vector loads), multiplies them in float32 by the matching slice of each of the M <= 4
    # rows of x and accumulates either a [BLOCK_N, BLOCK_K] tile reduced once at the end (REDUCE_EACH
    # off) or a [BLOCK_N] vector reduced per tile (on). STAGES > 1 pipelines the W tiles through shared
    # memory (cp.async, ``tl.range(num_stages=...)``); EVICT "evict_first" marks the W loads streaming.
    # Split-K (the bench's): SPLIT_K programs per N block write float32 partials [SPLIT_K, M, N] that
    # _splitk_reduce_kernel sums in a fixed order. ``mv_linear`` uses one split (P is y itself).

    @triton.jit
    def _row_fma(acc, w, X, ko, m: tl.constexpr, M, s_xm, km, EVEN_K: tl.constexpr, REDUCE_EACH: tl.constexpr):
        # acc (+)= w * x[m, ko] for one row m of x: [BLOCK_N, BLOCK_K] kept, or reduced over K now.
        if EVEN_K:
            if m == 0:  # M >= 1: row 0 is always there
                x = tl.load(X + ko).to(tl.float32)
            else:
                x = tl.load(X + m * s_xm + ko, mask=m < M, other=0.0).to(tl.float32)
        else:
            x = tl.load(X + m * s_xm + ko, mask=km & (m < M), other=0.0).to(tl.float32)
        p = w * x[None, :]
        if REDUCE_EACH:
            acc = acc + tl.reduce(p, 1, _add)
        else:
            acc = acc + p
        return acc

    @triton.jit
    def _store_row(P, acc, rn, nm, m: tl.constexpr, M, s_pm, REDUCE_EACH: tl.constexpr):
        if not REDUCE_EACH:
            acc = tl.reduce(acc, 1, _add)
        tl.store(P + m * s_pm + rn, acc.to(P.dtype.element_ty), mask=nm & (m < M))

    @triton.jit(do_not_specialize=["NT"])
    def _gemv_kernel(X, W, P, M, N, K, NT, s_xm, s_wn, s_pk, s_pm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
                     EVEN_K: tl.constexpr, REDUCE_EACH: tl.constexpr, EVICT: tl.constexpr, STAGES: tl.constexpr,
                     PDL: tl.constexpr = False, PF: tl.constexpr = 0, PF_LINES: tl.constexpr = 1):
        # P[pid_k, m, n] = sum over this program's K range (NT tiles of BLOCK_K from pid_k * NT * BLOCK_K)
        # of x[m, k] * W[n, k], for its BLOCK_N rows n; BLOCK_M in {1, 2, 4} rows of x (M <= BLOCK_M).
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        nm = rn < N
        k_lo = pid_k * NT * BLOCK_K  # a multiple of BLOCK_K by construction: the W loads stay 16-byte aligned
        if PDL:
            _prefetch_w(W, rn, N, K, k_lo, s_wn, BLOCK_K, PF, PF_LINES)
        _pdl_wait(PDL)
        wp = W + rn.to(tl.int64)[:, None] * s_wn + (k_lo + rk)[None, :]
        if REDUCE_EACH:
            a0 = tl.full([BLOCK_N], 0.0, tl.float32)
        else:
            a0 = tl.full([BLOCK_N, BLOCK_K], 0.0, tl.float32)
        a1 = a0
        a2 = a0
        a3 = a0
        for t in tl.range(0, NT, num_stages=STAGES):
            ko = k_lo + t * BLOCK_K + rk
            km = ko < K
            if EVEN_N and EVEN_K:
                w = tl.load(wp, eviction_policy=EVICT)
            elif EVEN_K:
                w = tl.load(wp, mask=nm[:, None], other=0.0, eviction_policy=EVICT)
            else:
                w = tl.load(wp, mask=nm[:, None] & km[None, :], other=0.0, eviction_policy=EVICT)
            w = w.to(tl.float32)
            a0 = _row_fma(a0, w, X, ko, 0, M, s_xm, km, EVEN_K, REDUCE_EACH)
            if BLOCK_M > 1:
                a1 = _row_fma(a1, w, X, ko, 1, M, s_xm, km, EVEN_K, REDUCE_EACH)
            if BLOCK_M > 2:
                a2 = _row_fma(a2, w, X, ko, 2, M, s_xm, km, EVEN_K, REDUCE_EACH)
                a3 = _row_fma(a3, w, X, ko, 3, M, s_xm, km, EVEN_K, REDUCE_EACH)
            wp += BLOCK_K
        P += pid_k * s_pk
        _store_row(P, a0, rn, nm, 0, M, s_pm, REDUCE_EACH)
        if BLOCK_M > 1:
            _store_row(P, a1, rn, nm, 1, M, s_pm, REDUCE_EACH)
        if BLOCK_M > 2:
            _store_row(P, a2, rn, nm, 2, M, s_pm, REDUCE_EACH)
            _store_row(P, a3, rn, nm, 3, M, s_pm, REDUCE_EACH)


GEMV_MAX_ROWS = 16  # the fused GEMVs pad the batch to one 16-row MMA tile: batch buckets up to 16


def _autotuned(device: torch.device) -> bool:
    """Whether the fused GEMVs pick their tiles by timing (on the GPU) or take fixed small ones (the
    interpreter). A function, so that a CPU test can send the interpreter down the GPU's launch path."""
    return device.type == "cuda"


def _normed(x: torch.Tensor, delta: torch.Tensor | None, lnw: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return (x, rmsnorm_ref(x, lnw, eps)) if delta is None else add_rmsnorm_ref(x, delta, lnw, eps)


def norm_qkv_rope_ref(x: torch.Tensor, delta: torch.Tensor | None, lnw: torch.Tensor, eps: float, w: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                      layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [B, nh, hd], residual): the residual add and norm, the QKV GEMM, RoPE and the KV store,
    as the unfused decode step does them (add_rmsnorm_ref or rmsnorm_ref, ``@``, rope_store_ref)."""
    r, h = _normed(x, delta, lnw, eps)
    return rope_store_ref(h @ w.t(), cos, sin, pos, K, V, layer), r


def norm_gu_silu_ref(x: torch.Tensor, delta: torch.Tensor | None, lnw: torch.Tensor, eps: float, w: torch.Tensor,
                     inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(gate) * up [B, inter], residual): add + norm, the gate/up GEMM, SwiGLU, unfused."""
    r, h = _normed(x, delta, lnw, eps)
    return silu_mul_ref(h @ w.t(), inter), r


def _norm_gemv2(x: torch.Tensor, delta: torch.Tensor | None, lnw: torch.Tensor, eps: float, w: torch.Tensor,
                out: torch.Tensor, n2: int, epi: int, rope: tuple | None = None) -> torch.Tensor:
    _need_triton()
    M, Kd = x.shape
    assert M <= GEMV_MAX_ROWS, f"the fused GEMV takes at most {GEMV_MAX_ROWS} rows, got {M}"
    assert x.stride(-1) == 1 and w.is_contiguous() and w.shape[1] == Kd and lnw.is_contiguous()
    r = x
    if delta is not None:
        assert delta.shape == x.shape and delta.stride(-1) == 1
        r = torch.empty_like(x)
    d_ = delta if delta is not None else x
    if rope is None:
        cos = sin = pos = KL = VL = x  # unused pointers (EPI 1)
        s_cos = s_kb = s_kh = s_kp = s_oh = 0
        half, nh, nkv = 1, 0, 0
    else:
        cos, sin, pos, KL, VL, nh, nkv, hd = rope
        assert cos.stride(-1) == 1 and sin.stride() == cos.stride() and KL.stride() == VL.stride()
        s_cos, s_kb, s_kh, s_kp, s_oh = cos.stride(0), KL.stride(0), KL.stride(1), KL.stride(2), out.stride(1)
        half = hd // 2
    args = (x, d_, lnw, r, w, out, cos, sin, pos, KL, VL, M, Kd, n2, float(eps),
            x.stride(0), d_.stride(0), r.stride(0), out.stride(0), s_oh, s_cos, s_kb, s_kh, s_kp)
    meta = dict(HALF=half, NH=nh, NKV=nkv, HAS_DELTA=delta is not None, EPI=epi, BLOCK_M=GEMV_MAX_ROWS,
                KV_EMU=rope is not None and _kv_emu(KL))
    if _autotuned(x.device):
        meta["F32"] = x.dtype == torch.float32 or x.device.type != "cuda"
        _norm_gemv2_tuned[lambda m: (triton.cdiv(n2, m["BLOCK_N"]),)](*args, **meta)
    else:  # the interpreter: fixed small tiles (several programs, several K steps), no timing
        _norm_gemv2_kernel[(triton.cdiv(n2, 16),)](*args, **meta, F32=True, BLOCK_N=16, BLOCK_K=32)
    return r


def norm_qkv_rope(x: torch.Tensor, delta: torch.Tensor | None, lnw: torch.Tensor, eps: float, w: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                  layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One Triton launch for :func:`norm_qkv_rope_ref`: (q [B, nh, hd], residual); row b's k and v go
    to slot b at ``pos[b]`` of ``K[layer]``/``V[layer]``. ``delta`` None: the residual is ``x``
    itself (the first layer, whose input is the embedding)."""
    B, nkv, hd = x.shape[0], K.shape[2], K.shape[4]
    nh = w.shape[0] // hd - 2 * nkv
    q = torch.empty(B, nh, hd, dtype=x.dtype, device=x.device)
    KL, VL = K[layer], V[layer]
    r = _norm_gemv2(x, delta, lnw, eps, w, q, w.shape[0] // 2, 2, (cos, sin, pos, KL, VL, nh, nkv, hd))
    return q, r


def norm_gu_silu(x: torch.Tensor, delta: torch.Tensor | None, lnw: torch.Tensor, eps: float, w: torch.Tensor,
                 inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One Triton launch for :func:`norm_gu_silu_ref`: (silu(gate) * up [B, inter], residual)."""
    assert w.shape[0] == 2 * inter
    act = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    r = _norm_gemv2(x, delta, lnw, eps, w, act, inter, 1)
    return act, r


# -- GEMV: the decode step's projections at batch 1 (--kernels triton-mv) -------------------------

MV_MAX_ROWS = 1  # mv_linear's kernel serves one row only: at M=2 it loses gate_up, at M=4 every shape


@dataclass(frozen=True)
class MvCfg:
    """One ``_gemv_kernel`` launch configuration (one K split: no partials, no second launch)."""

    block_n: int
    block_k: int
    warps: int
    stages: int
    reduce_each: bool = True
    evict: str = "evict_first"

    def label(self) -> str:
        """gemv_bench's label: n=BLOCK_N k=BLOCK_K w=warps s=stages x=split r/d=REDUCE_EACH on/off e=evict_first."""
        return (f"n{self.block_n}k{self.block_k}w{self.warps}s{self.stages}x1"
                f"{'r' if self.reduce_each else 'd'}{'e' if self.evict else ''}")


# The launch per decode shape (N, K) at M=1 where the running GPU's tables list it (gemv_bench.py's sweep), else
# MV_DEFAULT. Looked up, never tuned at run time.
MV_CONFIGS: dict[tuple[int, int], MvCfg] = {}
# Other shapes: gate_up's config (BLOCK_K 512 as four of the five winners; per-tile reduction and no
# shared-memory pipeline: the fewest registers and no smem, so it launches at any N and K).
MV_DEFAULT = MvCfg(8, 512, 4, 1, True, "evict_first")
_MV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def mv_config(n: int, k: int) -> MvCfg:
    """The launch configuration for W [n, k]: the table's, or :data:`MV_DEFAULT`."""
    return MV_CONFIGS.get((n, k), MV_DEFAULT)


def mv_linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.t()``: what FastModel's projections are (cuBLAS on the GPU)."""
    return x @ w.t()


mm_linear_ref = mv_linear_ref  # the skinny GEMM's reference is the same x @ w.t()


def mv_gemv(x: torch.Tensor, w: torch.Tensor, cfg: MvCfg, nt_short: int = 0) -> torch.Tensor:
    """x [M <= 4, K] @ w [N, K].T -> [M, N] in x's dtype by one ``_gemv_kernel`` launch with ``cfg``.
    ``nt_short`` runs each program that many K tiles short (the tests' deliberately wrong kernel)."""
    _need_triton()
    M, K = x.shape
    N = w.shape[0]
    assert 1 <= M <= 4 and x.stride(1) == 1 and w.stride(1) == 1 and w.shape[1] == K
    nt = triton.cdiv(K, cfg.block_k)
    # One output allocation per call, of a fixed size: under a CUDA graph it comes from the graph's
    # pool at capture, the same address every replay (as every kernel here allocates its output).
    y = (torch.zeros if nt_short else torch.empty)((M, N), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(N, cfg.block_n), 1)](
        x, w, y, M, N, K, nt - nt_short, x.stride(0), w.stride(0), 0, y.stride(0),
        BLOCK_M=1 if M == 1 else 2 if M == 2 else 4, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_N=N % cfg.block_n == 0, EVEN_K=K == nt * cfg.block_k, REDUCE_EACH=cfg.reduce_each,
        EVICT=cfg.evict, STAGES=cfg.stages, num_warps=cfg.warps, num_stages=cfg.stages, **_pdl(x, cfg.block_k))
    return y


def mv_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.t()``; for one row (M <= :data:`MV_MAX_ROWS`), contiguous, same dtype, on CUDA (or under
    the CPU interpreter) by the Triton GEMV with :func:`mv_config`'s launch configuration, else by torch.

    No host sync, no autotuning, one fixed-size output: capturable in a CUDA graph."""
    if (HAVE_TRITON and x.dim() == 2 and 1 <= x.shape[0] <= MV_MAX_ROWS and x.dtype == w.dtype
            and x.dtype in _MV_DTYPES and x.is_contiguous() and w.is_contiguous() and x.shape[1] == w.shape[1]
            and (x.is_cuda or _interpreting())):
        return mv_gemv(x, w, mv_config(w.shape[0], w.shape[1]))
    return x @ w.t()


