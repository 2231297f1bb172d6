"""GEMM: the skinny GEMM of ``--kernels triton-mm`` (``mm_linear``: all rows in one tile, deterministic split-K),
with SwiGLU in its epilogue (``mm_glu_linear``), the RMSNorm in its prologue (``mm_norm_linear``) or the residual
add in its epilogue (``mm_res_linear``), and its launch tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops need no triton
    triton = None

from .gemv import _MV_DTYPES, MV_MAX_ROWS, mv_linear
from .launch import HAVE_TRITON, _add, _fmax, _interpreting, _need_triton, _pdl, _pdl_wait, _prefetch_w  # noqa: F401

if HAVE_TRITON:
    @triton.jit(do_not_specialize=["SPLIT"])
    def _splitk_reduce_kernel(P, Y, N, SPLIT, s_pk, s_pm, s_ym, BLOCK: tl.constexpr, RES: tl.constexpr = False,
                              PDL: tl.constexpr = False):
        _pdl_wait(PDL)
        # Y[m, n] = sum over s of P[s, m, n], s in order (deterministic), rounded to Y's dtype. RES (--mm-norm):
        # Y[m, n] + that, rounded again (the residual add, in place: _mm_kernel's RES epilogue for split-K).
        rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = tl.program_id(1)
        nm = rn < N
        acc = tl.full([BLOCK], 0.0, tl.float32)
        for s in range(SPLIT):
            acc += tl.load(P + s * s_pk + m * s_pm + rn, mask=nm, other=0.0)
        if RES:
            acc = tl.load(Y + m * s_ym + rn, mask=nm, other=0.0).to(tl.float32) + acc.to(Y.dtype.element_ty).to(tl.float32)
        tl.store(Y + m * s_ym + rn, acc.to(Y.dtype.element_ty), mask=nm)

    # -- batch 16..64 (``mm_linear``): a skinny GEMM, y = x @ W.T, all M rows of x in one BLOCK_M tile ---
    # One program per BLOCK_N rows of W (and per K split): each W tile is read from HBM exactly once, the
    # [BLOCK_M, BLOCK_K] slices of x (<= 64 x K: L2-resident) alongside. tl.dot accumulates in float32
    # (Hopper: wgmma where the dot's M side is >= 64, else mma.sync). SWAP computes the transposed tile,
    # W [BLOCK_N, BLOCK_K] @ x.T [BLOCK_K, BLOCK_M]: the dot's M side is then BLOCK_N (wgmma even at
    # 16 rows of x: the swap-AB trick of skinny GEMMs). STAGES pipelines the tiles through shared memory
    # (``tl.range(num_stages=...)``: cp.async); EVICT "evict_first" marks W streaming. Split-K as the
    # GEMV's: float32 partials [SPLIT_K, M, N] summed in a fixed order by _splitk_reduce_kernel. F32 (the
    # CPU interpreter, float32 models) multiplies in float32 (the interpreter has no bf16 dot).

    @triton.jit
    def _mm_w_tile(wp, nm, km, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, EVICT: tl.constexpr):
        # One [BLOCK_N, BLOCK_K] tile of W (rows masked by nm where N is ragged, columns by km where K is).
        if EVEN_K:
            if EVEN_N:
                w = tl.load(wp, eviction_policy=EVICT)
            else:
                w = tl.load(wp, mask=nm[:, None], other=0.0, eviction_policy=EVICT)
        else:
            w = tl.load(wp, mask=nm[:, None] & km[None, :], other=0.0, eviction_policy=EVICT)
        return w

    @triton.jit
    def _mm_dot(x, w, acc, SWAP: tl.constexpr, F32: tl.constexpr):
        # acc += x @ w.T ([BLOCK_M, BLOCK_N]), or its transpose w @ x.T under SWAP; float32 products under F32.
        if F32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
            if SWAP:
                acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        elif SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        return acc

    @triton.jit(do_not_specialize=["M", "NT"])
    def _mm_kernel(X, W, P, M, N, K, NT, s_xm, s_wn, s_pk, s_pm, INTER, NW, R, s_rm, eps,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
                   EVEN_K: tl.constexpr, SWAP: tl.constexpr, EVICT: tl.constexpr, STAGES: tl.constexpr,
                   F32: tl.constexpr, GLU: tl.constexpr = False, NORM: tl.constexpr = False,
                   RES: tl.constexpr = False, PDL: tl.constexpr = False, PF: tl.constexpr = 0,
                   PF_LINES: tl.constexpr = 1):
        # P[pid_k, m, n] = sum over this program's NT tiles of BLOCK_K (from pid_k * NT * BLOCK_K) of
        # x[m, k] * W[n, k], for its BLOCK_N rows n and all M <= BLOCK_M rows m.
        # GLU (one split; W = [gate; up], its up half from row INTER; N = INTER): P[m, n] = SwiGLU of the
        # two dots, rounded as silu_mul rounds the GEMM's output (each dot to P's dtype, silu to it, the
        # product to it): the gate/up GEMM and _silu_mul_kernel in one launch, the [M, 2 x INTER] tensor
        # between them never written.
        # NORM (one split; --mm-norm): X is the residual stream and the GEMM's input is RMSNorm(X) * NW: each x tile
        # is multiplied by NW's slice and rounded to X's dtype before the dot, the rows' sums of squares gather in
        # the same K loop, and the dot is scaled by 1/sqrt(mean + eps) at the end (the rmsnorm launch before the
        # GEMM gone; rounded once where the separate norm rounds twice: not bit for bit, the gate judges it).
        # RES (--mm-norm): P[m, n] = R[m, n] + the product rounded to P's dtype, then the sum rounded, as
        # ``x + (x @ w.T)`` rounds (the residual add of add_rmsnorm); P may be R itself (in place). Split-K puts
        # it in the reduction instead.
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        nm = rn < N
        mm = rm < M
        k_lo = pid_k * NT * BLOCK_K
        if PDL:  # W's first tiles (and GLU's up rows') into L2 while the kernel before runs: weights, not its output
            _prefetch_w(W, rn, N, K, k_lo, s_wn, BLOCK_K, PF, PF_LINES)
            if GLU:
                _prefetch_w(W, INTER + rn, 2 * INTER, K, k_lo, s_wn, BLOCK_K, PF, PF_LINES)
        _pdl_wait(PDL)
        wp = W + rn.to(tl.int64)[:, None] * s_wn + (k_lo + rk)[None, :]
        xp = X + rm.to(tl.int64)[:, None] * s_xm + (k_lo + rk)[None, :]
        if SWAP:
            acc = tl.full([BLOCK_N, BLOCK_M], 0.0, tl.float32)
            acc_u = tl.full([BLOCK_N, BLOCK_M], 0.0, tl.float32)  # GLU's up half (unused otherwise)
        else:
            acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
            acc_u = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        up = W + (INTER + rn).to(tl.int64)[:, None] * s_wn + (k_lo + rk)[None, :]
        ss = tl.full([BLOCK_M], 0.0, tl.float32)  # NORM: the rows' sums of squares
        for t in tl.range(0, NT, num_stages=STAGES):
            km = (k_lo + t * BLOCK_K + rk) < K
            if EVEN_K:
                x = tl.load(xp, mask=mm[:, None], other=0.0)
            else:
                x = tl.load(xp, mask=mm[:, None] & km[None, :], other=0.0)
            if NORM:
                xf = x.to(tl.float32)
                ss += tl.reduce(xf * xf, 1, _add)
                nw = tl.load(NW + k_lo + t * BLOCK_K + rk, mask=km, other=0.0).to(tl.float32)
                x = (xf * nw[None, :]).to(X.dtype.element_ty)
            acc = _mm_dot(x, _mm_w_tile(wp, nm, km, EVEN_N, EVEN_K, EVICT), acc, SWAP, F32)
            if GLU:
                acc_u = _mm_dot(x, _mm_w_tile(up, nm, km, EVEN_N, EVEN_K, EVICT), acc_u, SWAP, F32)
                up += BLOCK_K
            wp += BLOCK_K
            xp += BLOCK_K
        if NORM:
            rstd = 1.0 / tl.sqrt(ss / K + eps)
            if SWAP:
                acc = acc * rstd[None, :]
                acc_u = acc_u * rstd[None, :]
            else:
                acc = acc * rstd[:, None]
                acc_u = acc_u * rstd[:, None]
        if GLU:
            dt = P.dtype.element_ty
            g = acc.to(dt).to(tl.float32)
            acc = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * acc_u.to(dt).to(tl.float32)
        P += pid_k * s_pk
        if SWAP:
            if RES:
                r = tl.load(R + rm[None, :] * s_rm + rn[:, None], mask=mm[None, :] & nm[:, None], other=0.0)
                acc = r.to(tl.float32) + acc.to(P.dtype.element_ty).to(tl.float32)
            tl.store(P + rm[None, :] * s_pm + rn[:, None], acc.to(P.dtype.element_ty), mask=mm[None, :] & nm[:, None])
        else:
            if RES:
                r = tl.load(R + rm[:, None] * s_rm + rn[None, :], mask=mm[:, None] & nm[None, :], other=0.0)
                acc = r.to(tl.float32) + acc.to(P.dtype.element_ty).to(tl.float32)
            tl.store(P + rm[:, None] * s_pm + rn[None, :], acc.to(P.dtype.element_ty), mask=mm[:, None] & nm[None, :])



# -- batch 16..64: the decode step's projections as a skinny Triton GEMM (--kernels triton-mm) ----

MM_ROWS = (16, 32, 64)  # the row buckets mm_linear serves (BLOCK_M): decode batches padded to 16, 32, 64
MM_RED_BLOCK = 1024  # split-K reduction: outputs per program (gemv_bench's RED_BLOCK)


@dataclass(frozen=True)
class MmCfg:
    """One ``_mm_kernel`` launch configuration; ``split_k`` > 1 adds the fixed-order partial reduction."""

    block_n: int
    block_k: int
    warps: int
    stages: int
    split_k: int = 1
    swap: bool = False
    evict: str = "evict_first"

    def label(self) -> str:
        """n=BLOCK_N k=BLOCK_K w=warps s=stages x=split_k, t=SWAP (W @ x.T), e=evict_first."""
        return (f"n{self.block_n}k{self.block_k}w{self.warps}s{self.stages}x{self.split_k}"
                f"{'t' if self.swap else ''}{'e' if self.evict else ''}")


# The launch per (row bucket, N, K) where the running GPU's tables list it (mm_bench.py: where Triton beat cuBLAS).
# Only ``--kernels triton-mm`` calls mm_linear in the engine; a shape not listed is x @ w.t() (cuBLAS).
MM_CONFIGS: dict[tuple[int, int, int], MmCfg] = {}


def mm_rows(m: int) -> int:
    """The row bucket (BLOCK_M) of an M-row input: 16, 32 or 64; 0 outside 1..64."""
    return next((b for b in MM_ROWS if m <= b), 0) if m >= 1 else 0


def mm_gemm(x: torch.Tensor, w: torch.Tensor, cfg: MmCfg, nt_short: int = 0, glu: int = 0,
            norm: tuple[torch.Tensor, float] | None = None, res: torch.Tensor | None = None) -> torch.Tensor:
    """x [M <= 64, K] @ w [N, K].T -> [M, N] in x's dtype by ``_mm_kernel`` with ``cfg`` (and, at split_k
    > 1, ``_splitk_reduce_kernel``). ``nt_short`` runs each program that many K tiles short (the tests'
    and the bench's deliberately wrong kernel). ``glu`` (= INTER, w the fused [gate; up] of 2 x INTER rows,
    one split): ``silu_mul(x @ w.t(), glu)`` [M, INTER] in the same launch, the same rounding.
    ``norm`` = (ln weight [K], eps), one split: ``rmsnorm(x, ln, eps) @ w.t()`` (x the residual stream) in the
    same launch, the norm's scale applied to the dot (rounded once: not bit for bit the two launches).
    ``res`` [M, N] (not with glu): ``res + x @ w.t()`` written into ``res`` (in place, rounded as torch's add
    of the rounded product) and returned."""
    _need_triton()
    M, K = x.shape
    N = glu or w.shape[0]
    bm = mm_rows(M)
    assert bm and x.stride(1) == 1 and w.stride(1) == 1 and w.shape[1] == K
    assert not glu or (w.shape[0] == 2 * glu and cfg.split_k == 1), "GLU: w is [gate; up], one split"
    assert norm is None or (cfg.split_k == 1 and norm[0].shape == (K,) and norm[0].is_contiguous()), \
        "NORM: one split, a contiguous ln weight of K"
    assert res is None or (not glu and res.shape == (M, N) and res.dtype == x.dtype and res.stride(1) == 1), \
        "RES: a residual [M, N] of x's dtype, not with GLU"
    split = cfg.split_k
    nt = triton.cdiv(triton.cdiv(K, split), cfg.block_k)
    alloc = torch.zeros if nt_short else torch.empty  # a skipped tile must not find the answer left over
    y = res if res is not None else alloc((M, N), dtype=x.dtype, device=x.device)
    if split == 1:
        p, s_pk, s_pm = y, 0, y.stride(0)
    else:
        p, s_pk, s_pm = alloc((split, M, N), dtype=torch.float32, device=x.device), M * N, N
    nw, eps = norm if norm is not None else (x, 0.0)
    r = res if res is not None else x
    _mm_kernel[(triton.cdiv(N, cfg.block_n), split)](
        x, w, p, M, N, K, nt - nt_short, x.stride(0), w.stride(0), s_pk, s_pm, glu, nw, r, r.stride(0), float(eps),
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_N=N % cfg.block_n == 0,
        EVEN_K=K == split * nt * cfg.block_k, SWAP=cfg.swap, EVICT=cfg.evict, STAGES=cfg.stages,
        F32=x.dtype == torch.float32 or x.device.type != "cuda", GLU=bool(glu), NORM=norm is not None,
        RES=res is not None and split == 1, num_warps=cfg.warps, num_stages=cfg.stages, **_pdl(x, cfg.block_k))
    if split > 1:
        _splitk_reduce_kernel[(triton.cdiv(N, MM_RED_BLOCK), M)](p, y, N, split, s_pk, s_pm, y.stride(0),
                                                                 BLOCK=MM_RED_BLOCK, RES=res is not None, num_warps=4,
                                                                 **_pdl(p))
    return y


def mm_config(m: int, n: int, k: int) -> MmCfg | None:
    """The table's launch configuration for M rows of x against W [n, k], or None (then: cuBLAS)."""
    return MM_CONFIGS.get((mm_rows(m), n, k))


def mmv_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``--kernels triton-mm``'s projection: :func:`mv_linear` at one row, :func:`mm_linear` above."""
    return mv_linear(x, w) if x.shape[0] <= MV_MAX_ROWS else mm_linear(x, w)


def mm_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.t()``; by the skinny Triton GEMM where :data:`MM_CONFIGS` has this (row bucket, N, K) and x
    and w are contiguous, of one dtype, on CUDA (or under the CPU interpreter); else exactly x @ w.t().

    No host sync, no autotuning, fixed-size outputs: capturable in a CUDA graph."""
    if (HAVE_TRITON and x.dim() == 2 and x.dtype == w.dtype and x.dtype in _MV_DTYPES and x.is_contiguous()
            and w.is_contiguous() and x.shape[1] == w.shape[1] and (x.is_cuda or _interpreting())):
        cfg = mm_config(x.shape[0], w.shape[0], w.shape[1])
        if cfg is not None:
            return mm_gemm(x, w, cfg)
    return x @ w.t()


# --mm-glu on: the decode step's gate/up GEMM and SwiGLU as one _mm_kernel launch (GLU) per (row bucket, 2 x INTER,
# K) the running GPU's tables list (mm_bench.py --glu-only prints the winners; paste_tables.py writes them there);
# other shapes keep the two launches.
MM_GLU_CONFIGS: dict[tuple[int, int, int], MmCfg] = {}


def mm_glu_linear(x: torch.Tensor, w: torch.Tensor, inter: int,
                  norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor | None:
    """``silu_mul(x @ w.t(), inter)`` (w the fused [gate; up]) in one skinny-GEMM launch, for 2..64 rows where
    :data:`MM_GLU_CONFIGS` lists the shape and x, w are contiguous, of one dtype, on CUDA (or under the CPU
    interpreter); else None (the caller runs its two launches). Capturable in a CUDA graph. ``norm`` = (ln
    weight, eps), --mm-norm: x is the residual stream and ``rmsnorm(x)`` the GEMM's input, in the same launch
    (mm_gemm's NORM), where :data:`MM_FUSE_CONFIGS` lists ("glu_norm", the shape); else None."""
    if _mm_ok(x, w) and w.shape[0] == 2 * inter:
        if norm is None:
            cfg = MM_GLU_CONFIGS.get((mm_rows(x.shape[0]), w.shape[0], w.shape[1]))
        else:
            cfg = fuse_config("glu_norm", *x.shape[:1], *w.shape)
        if cfg is not None:
            return mm_gemm(x, w, cfg, glu=inter, norm=norm)
    return None


def _mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """x, w fit the skinny GEMM: 2..64 rows of x, both contiguous, one dtype of the GEMV's, on CUDA (or interpreted)."""
    return (HAVE_TRITON and x.dim() == 2 and MV_MAX_ROWS < x.shape[0] <= MM_ROWS[-1] and x.dtype == w.dtype
            and x.dtype in _MV_DTYPES and x.is_contiguous() and w.is_contiguous() and x.shape[1] == w.shape[1]
            and (x.is_cuda or _interpreting()))


# --mm-norm on: the fused launches by (kind, row bucket, N, K), kind "norm" (the RMSNorm before the GEMM in its
# prologue: QKV, gate/up without --mm-glu, lm_head), "glu_norm" (the same in the GLU launch: gate/up with --mm-glu) or
# "res" (the residual add after the GEMM in its epilogue, or split-K's reduction: O, down). Only the launches the
# running GPU's tables list are fused (mm_bench.py --fuse-only times each against today's launches pair by pair: a RES
# launch is listed only where it wins with the norm launch it leaves); any other keeps its own norm or add launch.
MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {}
FUSE_KINDS = ("norm", "glu_norm", "res")


def fuse_config(kind: str, m: int, n: int, k: int) -> MmCfg | None:
    """:data:`MM_FUSE_CONFIGS`' launch for a ``kind`` fused launch of M rows against W [n, k] (None: not fused)."""
    cfg = MM_FUSE_CONFIGS.get((kind, mm_rows(m), n, k))
    return None if cfg is None or (kind != "res" and cfg.split_k != 1) else cfg


def mm_norm_linear(x: torch.Tensor, ln: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor | None:
    """``--mm-norm on``: ``rmsnorm(x, ln, eps) @ w.t()`` in one skinny-GEMM launch (the norm in the prologue: mm_gemm's
    NORM) for 2..64 rows where :data:`MM_FUSE_CONFIGS` lists ("norm", the shape); else None (the caller runs the norm
    and the GEMM). Capturable in a CUDA graph."""
    if _mm_ok(x, w) and ln.is_contiguous():
        cfg = fuse_config("norm", *x.shape[:1], *w.shape)
        if cfg is not None:
            return mm_gemm(x, w, cfg, norm=(ln, eps))
    return None


def mm_res_linear(x: torch.Tensor, w: torch.Tensor, res: torch.Tensor) -> torch.Tensor | None:
    """``--mm-norm on``: ``res + x @ w.t()`` written into ``res`` in one skinny-GEMM launch (the residual add in the
    epilogue, or in split-K's reduction: mm_gemm's RES) for 2..64 rows where :data:`MM_FUSE_CONFIGS` lists ("res",
    the shape); else None, ``res`` untouched (the caller adds). The same rounding as ``res + x @ w.t()``. Capturable
    in a CUDA graph."""
    if (_mm_ok(x, w) and res.dtype == x.dtype and res.is_contiguous()
            and tuple(res.shape) == (x.shape[0], w.shape[0])):
        cfg = fuse_config("res", *x.shape[:1], *w.shape)
        if cfg is not None:
            return mm_gemm(x, w, cfg, res=res)
    return None


