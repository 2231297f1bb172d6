"""The fast engine's Triton kernels, each beside the torch code it replaces (its reference in the tests).

Every kernel fuses several torch launches of the decode step (and some of prefill's) into one, so that the
step's non-GEMM work stops paying a round trip through HBM and a launch per elementwise operation:

* norms: ``rmsnorm`` and ``add_rmsnorm`` (the residual add fused with the norm after it, the sum written
  alongside): one launch per norm instead of ~8;
* SwiGLU: ``silu_mul`` (silu, slice and multiply of the fused gate/up output);
* RoPE + KV store: ``rope_store`` rotates q and k (rotate-half convention) and writes k and v into the KV pool
  in one launch, for decode rows and for every packed prefill row (from ``ROPE_ROWS_MIN`` rows, ``ROPE_ROWS``
  rows of a head per program);
* attention: ``decode_attn``, flash-decoding over the pool that stops at each row's position; split-KV
  (``split_count`` slices per (row, KV head) so the programs fill the GPU, then ``combine_splits``), with
  dots in float32 (tf32) or, ``--decode-attn lowp``, in the cache's dtype; over an fp8 pool (``--kv-cache-dtype
  fp8``) K/V are widened on load;
* GEMV (``--kernels triton-gemv``): ``norm_qkv_rope`` and ``norm_gu_silu``, the QKV and gate/up projections at
  batch <= ``GEMV_MAX_ROWS`` with the add + norm in their prologue and RoPE + KV store or SwiGLU in their
  epilogue; (``--kernels triton-mv``) ``mv_linear``, a plain GEMV for the five projections at batch 1;
* GEMM (``--kernels triton-mm``): ``mm_linear``, a skinny GEMM for batch 2..64 (all rows in one tile, each
  weight tile read once, deterministic split-K), optionally with SwiGLU in its epilogue (``mm_glu_linear``,
  ``--mm-glu``), the RMSNorm in its prologue (``mm_norm_linear``) or the residual add in its epilogue
  (``mm_res_linear``, both ``--mm-norm``);
* launch helpers: programmatic dependent launch (``set_pdl``, ``--pdl``: each kernel waits on the one before
  it, the GEMMs prefetch weights into L2 first), the CPU interpreter's shims, and ``get_ops`` (``torch``,
  ``triton``, ``triton-gemv``, ``triton-mv``, ``triton-mm``), which returns the same callables each way so the
  engine switches with one line per call site.

Launch parameters come from tables tuned per GPU (``MV_CONFIGS``, ``MM_CONFIGS``, ``MM_GLU_CONFIGS``,
``MM_FUSE_CONFIGS``, ``ATTN_CONFIGS``, ``ATTN_LOWP``, ``ATTN_LOWP_FP8``): the engine installs the running GPU's
with :func:`load_tables` (hfserve/tables/<GPU name>.json, written by benchmarks/gpu/paste_tables.py from the
sweeps of gemv_bench.py and mm_bench.py); a GPU without a file gets empty tables: cuBLAS and the default
launches. A shape no table lists runs as torch (x @ w.t()) or with the default launch.

Layouts: KV pool ``[layers, slots, kv_heads, capacity, head_dim]``; fused qkv ``[B, (nh + 2*nkv) * hd]``;
cos/sin tables ``[positions, hd]``. Nothing here syncs with the host, so every op may be captured in a CUDA
graph. Only Triton API present in 3.6 is used; on the CPU the kernels run under ``TRITON_INTERPRET=1`` (set
before triton is imported). Measured speed: docs/results.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from .tables import read_tables, table_path

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops need no triton
    triton = None

__all__ = ["Ops", "get_ops", "rmsnorm_ref", "add_rmsnorm_ref", "silu_mul_ref", "rope_store_ref", "decode_attn_ref",
           "rmsnorm", "add_rmsnorm", "silu_mul", "rope_store", "decode_attn", "decode_attn_partials",
           "combine_splits", "combine_splits_ref", "split_count", "HAVE_TRITON", "GEMV_MAX_ROWS",
           "norm_qkv_rope", "norm_qkv_rope_ref", "norm_gu_silu", "norm_gu_silu_ref",
           "MV_MAX_ROWS", "MV_CONFIGS", "MV_DEFAULT", "MvCfg", "mv_config", "mv_gemv", "mv_linear", "mv_linear_ref",
           "MM_ROWS", "MM_CONFIGS", "MmCfg", "mm_rows", "mm_config", "mm_gemm", "mm_linear", "mm_linear_ref", "mmv_linear",
           "MM_GLU_CONFIGS", "mm_glu_linear", "MM_FUSE_CONFIGS", "FUSE_KINDS", "fuse_config", "mm_norm_linear",
           "mm_res_linear", "set_pdl", "pdl_on", "PDL_PREFETCH", "pdl_prefetch_kw",
           "ATTN_CONFIGS", "AttnCfg", "attn_config", "ATTN_LOWP", "DECODE_ATTN", "decode_attn_config",
           "TABLE_KINDS", "tables_for", "load_tables"]

HAVE_TRITON = triton is not None


def _interpreter_shim() -> None:
    """Let the CPU interpreter take a loaded scalar as a loop bound under numpy >= 2.

    Triton 3.6's interpreter holds scalars as 1-element arrays and turns them into a Python int
    with ``int(array)``, which numpy 2 refuses for arrays of one dimension; ``range(0, n, BLOCK)``
    with ``n`` loaded from memory (decode_attn's stop at ``pos``) then fails on the CPU only.
    This re-registers ``__index__`` per launch to read the single element; compiled runs never
    come here.
    """
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() not in ("1", "true", "on", "yes"):
        return
    from triton.runtime import interpreter

    orig = interpreter._patch_lang_tensor
    if getattr(orig, "_infergoal_shim", False):
        return

    def patched(tensor, scope):  # noqa: ANN001 (triton's internal types)
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._infergoal_shim = True
    interpreter._patch_lang_tensor = patched


if HAVE_TRITON:
    _interpreter_shim()


def _into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    if out is None:
        return y
    out.copy_(y)
    return out


# -- torch references (FastModel's arithmetic) -------------------------------------------------


def rmsnorm_ref(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm as HF Llama does it: float32 statistics, cast back, then times the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return _into(out, w * xf.to(x.dtype))


def add_rmsnorm_ref(x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float,
                    out: torch.Tensor | None = None,
                    residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual, normed) = (x + delta, rmsnorm(x + delta) * w)."""
    r = _into(residual_out, x + delta)
    return r, rmsnorm_ref(r, w, eps, out)


def silu_mul_ref(gu: torch.Tensor, inter: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's activation on the fused gate/up output: silu(gu[..., :inter]) * gu[..., inter:]."""
    return _into(out, F.silu(gu[..., :inter]) * gu[..., inter:])


def _rot(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def rope_store_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
                   K: torch.Tensor, V: torch.Tensor, layer: int, q_out: torch.Tensor | None = None,
                   slots: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate q and k of B rows, store k and v at ``K[layer, slots[b], :, pos[b]]``; return q [B, nh, hd].

    ``slots`` defaults to the row index (a decode step: row b is slot b); a prefill passes the
    slot of each row's sequence, so packed prompts' rows land in their own slots."""
    B, nkv, hd = qkv.shape[0], K.shape[2], K.shape[4]
    nh = qkv.shape[-1] // hd - 2 * nkv
    q_end, k_end = nh * hd, (nh + nkv) * hd
    q, k, v = qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    q = q.view(B, nh, hd)
    k = k.view(B, nkv, hd)
    q = q * c + _rot(q) * s
    k = k * c + _rot(k) * s
    rows = torch.arange(B, device=qkv.device) if slots is None else slots
    K[layer, rows, :, pos] = k.to(K.dtype)  # an fp8 pool (--kv-cache-dtype fp8): rounded to nearest, scale 1
    V[layer, rows, :, pos] = v.reshape(B, nkv, hd).to(V.dtype)
    return _into(q_out, q)


def decode_attn_ref(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, layer: int, B: int, pos: torch.Tensor,
                    ctx: int, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """GQA decode attention over cache ``[0, ctx)`` masked to ``<= pos[b]``; returns [B, nh*hd]."""
    nh, hd, nkv = q.shape[1], q.shape[2], K.shape[2]
    g = nh // nkv
    keep = torch.arange(ctx, device=q.device)[None, :] <= pos[:, None]
    bias = torch.zeros(B, ctx, device=q.device, dtype=torch.float32).masked_fill(~keep, float("-inf"))
    kc, vc = K[layer, :B, :, :ctx].to(q.dtype), V[layer, :B, :, :ctx].to(q.dtype)  # an fp8 pool: widened
    s = torch.matmul(q.view(B, nkv, g, hd), kc.transpose(-1, -2)).float() * scale
    p = torch.softmax(s + bias[:, None, None, :], dim=-1).to(q.dtype)
    return _into(out, torch.matmul(p, vc).reshape(B, nh * hd))


# -- Triton kernels -----------------------------------------------------------------------------

if HAVE_TRITON:
    # Reductions go through tl.reduce with our own combine functions, not tl.sum / tl.max: those
    # are @jit functions of triton's standard library, fixed as compiled or interpreted when triton
    # is first imported, so a process that imported triton before setting TRITON_INTERPRET (pytest
    # over the whole suite: transformers imports it) could not run them on the CPU. Same code on GPU.

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _fmax(a, b):
        return tl.maximum(a, b)

    # --pdl on: a kernel launched with ``launch_pdl`` may be placed on the SMs while the kernel
    # before it in the stream is still running (Hopper's programmatic dependent launch; in a CUDA graph, a
    # programmatic edge). Its first act is ``griddepcontrol.wait`` -- until that kernel has finished and its writes
    # are visible -- so every load and store after it sees the stream's order; then it lets the next kernel be
    # placed in turn. What it gains is the launch and placement of each kernel hidden behind the one before: the
    # ~1 us between kernels of the decode graph. Only weights (which no kernel of the step writes) are touched
    # before the wait: _l2_prefetch's first K tiles of W into L2.

    @triton.jit
    def _pdl_wait(PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _l2_prefetch(ptrs):
        # One ``prefetch.global.L2`` per pointer (the caller passes one per 128-byte line): no register is loaded.
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)

    @triton.jit
    def _prefetch_w(W, rows, N, K, k_lo, s_wn, BLOCK_K: tl.constexpr, PF: tl.constexpr, PF_LINES: tl.constexpr):
        # The first PF tiles of BLOCK_K columns from k_lo of W's rows ``rows`` (clamped into W), a line apart.
        rp = W + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * s_wn
        for t in tl.static_range(PF):
            c = tl.minimum(k_lo + t * BLOCK_K + tl.arange(0, PF_LINES) * (BLOCK_K // PF_LINES), K - 1)
            _l2_prefetch(rp + c[None, :])

    @triton.jit
    def _rmsnorm_kernel(X, D, W, R, Y, sx, sd, sr, sy, N, eps,
                        HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        _pdl_wait(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < N
        dt = Y.dtype.element_ty
        x = tl.load(X + row * sx + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_DELTA:
            # The residual is rounded to the model dtype first, as ``x + delta`` is in torch.
            x = (x + tl.load(D + row * sd + offs, mask=m, other=0.0).to(tl.float32)).to(dt)
            tl.store(R + row * sr + offs, x, mask=m)
            x = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.reduce(x * x, 0, _add) / N + eps)
        w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
        y = (x * rstd).to(dt).to(tl.float32) * w
        tl.store(Y + row * sy + offs, y.to(dt), mask=m)

    @triton.jit
    def _silu_mul_kernel(GU, OUT, sg, so, INTER, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        _pdl_wait(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < INTER
        dt = OUT.dtype.element_ty
        g = tl.load(GU + row * sg + offs, mask=m, other=0.0).to(tl.float32)
        u = tl.load(GU + row * sg + INTER + offs, mask=m, other=0.0).to(tl.float32)
        a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(OUT + row * so + offs, (a * u).to(dt), mask=m)

    @triton.jit
    def _kv_cast(x, DST: tl.constexpr, KV_EMU: tl.constexpr):
        # A value for the KV pool (dtype DST): bf16 as is; fp8 e4m3 (scale 1) rounded to nearest even and
        # saturated at +-448. KV_EMU (the CPU interpreter only): the rounding done here in float32 first, since
        # the interpreter's own float -> fp8 conversion rounds wrongly (half up, and -0.486 to -0.25: no carry
        # into the exponent); it converts exact e4m3 values exactly. On the GPU the hardware conversion does it.
        x = x.to(tl.float32)
        if KV_EMU:
            a = tl.minimum(tl.abs(x), 448.0)
            e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0)  # below 2**-6: subnormal steps 2**-9
            ulp = tl.exp2(e - 3.0)
            v = a / ulp
            r = tl.floor(v + 0.5)
            r = tl.where(((r - v) == 0.5) & ((r - 2.0 * tl.floor(r * 0.5)) == 1.0), r - 1.0, r)  # ties to even
            x = tl.where(x < 0, -r * ulp, r * ulp)
        return x.to(DST)

    @triton.jit
    def _rope_store_kernel(QKV, COS, SIN, POS, SLOT, QO, KL, VL, s_qkv, s_cos, s_qb, s_qh, s_kb, s_kh, s_kp,
                           NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, BLOCK_D: tl.constexpr,
                           HAS_SLOT: tl.constexpr, KV_EMU: tl.constexpr = False, PDL: tl.constexpr = False):
        # One program per (row, head) over the nh q heads and then the nkv k heads; a k program
        # also copies its v head, so the whole step's RoPE and KV store is this one launch.
        _pdl_wait(PDL)
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        p = tl.load(POS + b).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        dm = d < HD
        half: tl.constexpr = HD // 2
        partner = tl.where(d < half, d + half, d - half)
        sign = tl.where(d < half, -1.0, 1.0)
        dt = QO.dtype.element_ty
        c = tl.load(COS + p * s_cos + d, mask=dm, other=0.0).to(tl.float32)
        s = tl.load(SIN + p * s_cos + d, mask=dm, other=0.0).to(tl.float32)
        base = QKV + b * s_qkv + h * HD
        x = tl.load(base + d, mask=dm, other=0.0).to(tl.float32)
        xr = tl.load(base + partner, mask=dm, other=0.0).to(tl.float32) * sign
        # Round each product as torch's ``q * cos + rot(q) * sin`` does in the model dtype.
        y = ((x * c).to(dt).to(tl.float32) + (xr * s).to(dt).to(tl.float32)).to(dt)
        if h < NH:
            tl.store(QO + b * s_qb + h * s_qh + d, y, mask=dm)
        else:
            kh = h - NH
            sl = b
            if HAS_SLOT:  # a prefill row: its sequence's slot; a decode row b is slot b
                sl = tl.load(SLOT + b).to(tl.int64)
            off = sl * s_kb + kh * s_kh + p * s_kp + d
            tl.store(KL + off, _kv_cast(y, KL.dtype.element_ty, KV_EMU), mask=dm)  # the pool's dtype: bf16 or fp8
            v = tl.load(QKV + b * s_qkv + (NH + NKV + kh) * HD + d, mask=dm, other=0.0)
            tl.store(VL + off, _kv_cast(v, VL.dtype.element_ty, KV_EMU), mask=dm)

    @triton.jit
    def _rope_store_rows_kernel(QKV, COS, SIN, POS, SLOT, QO, KL, VL, B, s_qkv, s_cos, s_qb, s_qh, s_kb, s_kh, s_kp,
                                NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, BLOCK_D: tl.constexpr,
                                ROWS: tl.constexpr, KV_EMU: tl.constexpr = False):
        # _rope_store_kernel's arithmetic, element for element, over ROWS rows of one head per program
        # (prefill: thousands of rows, each stored at its own (slot, pos)). One (row, head) per program
        # is 256 bytes of q in a one-warp program: 164k of them at 4096 rows, ~1 TB/s on the H200.
        r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        h = tl.program_id(1)
        rm = r < B
        p = tl.load(POS + r, mask=rm, other=0).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        dm = d < HD
        m2 = rm[:, None] & dm[None, :]
        half: tl.constexpr = HD // 2
        partner = tl.where(d < half, d + half, d - half)
        sign = tl.where(d < half, -1.0, 1.0)
        dt = QO.dtype.element_ty
        c = tl.load(COS + p[:, None] * s_cos + d[None, :], mask=m2, other=0.0).to(tl.float32)
        s = tl.load(SIN + p[:, None] * s_cos + d[None, :], mask=m2, other=0.0).to(tl.float32)
        base = QKV + r[:, None] * s_qkv + h * HD
        x = tl.load(base + d[None, :], mask=m2, other=0.0).to(tl.float32)
        xr = tl.load(base + partner[None, :], mask=m2, other=0.0).to(tl.float32) * sign[None, :]
        y = ((x * c).to(dt).to(tl.float32) + (xr * s).to(dt).to(tl.float32)).to(dt)
        if h < NH:
            tl.store(QO + r[:, None] * s_qb + h * s_qh + d[None, :], y, mask=m2)
        else:
            kh = h - NH
            sl = tl.load(SLOT + r, mask=rm, other=0).to(tl.int64)
            off = sl[:, None] * s_kb + kh * s_kh + p[:, None] * s_kp + d[None, :]
            tl.store(KL + off, _kv_cast(y, KL.dtype.element_ty, KV_EMU), mask=m2)
            v = tl.load(QKV + r[:, None] * s_qkv + (NH + NKV + kh) * HD + d[None, :], mask=m2, other=0.0)
            tl.store(VL + off, _kv_cast(v, VL.dtype.element_ty, KV_EMU), mask=m2)

    @triton.jit
    def _widen_reg(x, QP):
        # LOWP 3's widening of an fp8 tile to QP's dtype, behind an identity marked impure (see _attn_span)
        cdt = QP.dtype.element_ty
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x.to(cdt)], dtype=cdt, is_pure=False, pack=2)

    @triton.jit
    def _attn_span(q, QP, kbase, vbase, lo, hi, s_kp, qk_scale, d, dm, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, PREC: tl.constexpr, LOWP: tl.constexpr = 0):
        # The online softmax both decode kernels share: the G query heads ``q`` of one (row, kv head)
        # over cache columns [lo, hi), scores in log2 units (qk_scale includes log2(e)). Returns the
        # unnormalised (running max m, sum l, accumulator acc) in float32; an empty span gives
        # (-inf, 0, 0), which the split reduction weighs as nothing. LOWP 0: K and V widened to float32,
        # tf32/ieee dots. LOWP 1: the dots in the cache's dtype (bf16 MMA, float32 accumulation; products
        # exact) with the probabilities rounded to it for P @ V, as decode_attn_ref rounds them. LOWP 2:
        # LOWP 1's arithmetic with float32 dots (the CPU interpreter, which has no bf16 dot).
        # "The cache's dtype" is the activations' (QP's, bf16): an fp8 pool's K and V are widened to it first
        # (exact: e4m3 values are bf16 values), so LOWP 1 stays a bf16 MMA and LOWP 0 a tf32 one.
        # LOWP 3: LOWP 1 over an fp8 pool widened in registers right after each load, behind an identity
        # marked impure (inline PTX, compiled kernels only), which the compiler neither moves nor removes: so
        # the tiles reach the MMA through shared memory as bf16 (ldmatrix); under LOWP 1 the compiler sinks
        # the conversion past shared memory and P @ V's operand, gathered along the context, is read back
        # from it a byte at a time (sm_90).
        cdt = QP.dtype.element_ty
        if LOWP == 1 or LOWP == 3:
            q = q.to(cdt)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.full([BLOCK_G], 0.0, tl.float32)
        acc = tl.full([BLOCK_G, BLOCK_D], 0.0, tl.float32)
        for start in range(lo, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            cm = cols < hi
            kvm = cm[:, None] & dm[None, :]
            k = tl.load(kbase + cols[:, None] * s_kp + d[None, :], mask=kvm, other=0.0)
            if LOWP == 3:
                k = _widen_reg(k, QP)
            if LOWP == 1 or LOWP == 3:
                s = tl.dot(q, tl.trans(k.to(cdt))) * qk_scale
            else:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=PREC) * qk_scale
            s = tl.where(cm[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, _fmax))
            alpha = tl.exp2(m_i - m_new)
            pe = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.reduce(pe, 1, _add)
            v = tl.load(vbase + cols[:, None] * s_kp + d[None, :], mask=kvm, other=0.0)
            if LOWP == 3:
                v = _widen_reg(v, QP)
            if LOWP == 1 or LOWP == 3:
                pv = tl.dot(pe.to(cdt), v.to(cdt))
            elif LOWP == 2:
                pv = tl.dot(pe.to(cdt).to(tl.float32), v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(pe, v.to(tl.float32), input_precision=PREC)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit(do_not_specialize=["CTX"])
    def _decode_attn_kernel(Q, KL, VL, POS, OUT, CTX, qk_scale, s_qb, s_qh, s_kb, s_kh, s_kp, s_ob,
                            G: tl.constexpr, HD: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_N: tl.constexpr, PREC: tl.constexpr, LOWP: tl.constexpr = 0,
                            PDL: tl.constexpr = False):
        # One program per (row, kv head): its G query heads share every key/value load (GQA).
        _pdl_wait(PDL)
        b = tl.program_id(0).to(tl.int64)
        kh = tl.program_id(1)
        p = tl.load(POS + b).to(tl.int32)
        n = tl.minimum(p + 1, CTX)  # padded rows may sit past the bucket; the reference then sees all of it
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        gm = g < G
        dm = d < HD
        dt = OUT.dtype.element_ty
        heads = kh * G + g
        # Dots in float32: bf16/fp16 values are exact in tf32, so PREC="tf32" costs no accuracy and
        # the CPU interpreter (which cannot multiply bf16) runs the same code.
        q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=gm[:, None] & dm[None, :],
                    other=0.0).to(tl.float32)
        kbase = KL + b * s_kb + kh * s_kh
        vbase = VL + b * s_kb + kh * s_kh
        m_i, l_i, acc = _attn_span(q, Q, kbase, vbase, 0, n, s_kp, qk_scale, d, dm,
                                   BLOCK_G, BLOCK_D, BLOCK_N, PREC, LOWP)
        o = acc / l_i[:, None]
        tl.store(OUT + b * s_ob + heads[:, None] * HD + d[None, :], o.to(dt), mask=gm[:, None] & dm[None, :])

    @triton.jit(do_not_specialize=["CTX", "S", "CHUNK"])
    def _decode_attn_split_kernel(Q, KL, VL, POS, M, L, ACC, CTX, S, CHUNK, qk_scale, s_qb, s_qh, s_kb, s_kh, s_kp,
                                  NH: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, BLOCK_G: tl.constexpr,
                                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                                  LOWP: tl.constexpr = 0, PDL: tl.constexpr = False):
        _pdl_wait(PDL)
        # One program per (row, kv head, split): the same online softmax as _decode_attn_kernel over
        # cache columns [split * CHUNK, min((split + 1) * CHUNK, n)), leaving its unnormalised partial
        # (running max m in log2 units, sum l, accumulator acc) in float32 for _attn_reduce_kernel.
        # A split wholly past n writes m = -inf, l = 0, acc = 0, which the reduction weighs as nothing.
        # The context bucket, the split count and the chunk are runtime arguments, not specialised: every
        # (batch, context) graph of a max batch size runs one compiled kernel, so a server that captures
        # new batch sizes compiles nothing new (they were constexprs: one compile per bucket pair, 13 s
        # of the H200's first capture at a new max batch).
        b = tl.program_id(0).to(tl.int64)
        kh = tl.program_id(1)
        sp = tl.program_id(2)
        p = tl.load(POS + b).to(tl.int32)
        n = tl.minimum(p + 1, CTX)
        lo = sp * CHUNK
        hi = tl.minimum(lo + CHUNK, n)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        gm = g < G
        dm = d < HD
        heads = kh * G + g
        q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=gm[:, None] & dm[None, :],
                    other=0.0).to(tl.float32)
        kbase = KL + b * s_kb + kh * s_kh
        vbase = VL + b * s_kb + kh * s_kh
        m_i, l_i, acc = _attn_span(q, Q, kbase, vbase, lo, hi, s_kp, qk_scale, d, dm,
                                   BLOCK_G, BLOCK_D, BLOCK_N, PREC, LOWP)
        row = (b * NH + heads) * S + sp  # partials laid out [B, nh, S] and [B, nh, S, hd]
        tl.store(M + row, m_i, mask=gm)
        tl.store(L + row, l_i, mask=gm)
        tl.store(ACC + row[:, None] * HD + d[None, :], acc, mask=gm[:, None] & dm[None, :])

    @triton.jit(do_not_specialize=["S"])
    def _attn_reduce_kernel(M, L, ACC, OUT, s_ob, S, NH: tl.constexpr, HD: tl.constexpr,
                            BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
        _pdl_wait(PDL)
        # One program per (row, q head): rescale each split's partial to the common max and add up.
        # S is a runtime argument (one compile per power-of-two BLOCK_S, not per split count).
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        sp = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        sm = sp < S
        dm = d < HD
        row = (b * NH + h) * S + sp
        m = tl.load(M + row, mask=sm, other=float("-inf"))
        l_s = tl.load(L + row, mask=sm, other=0.0)
        acc = tl.load(ACC + row[:, None] * HD + d[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
        mx = tl.reduce(m, 0, _fmax)  # finite: split 0 always holds position 0
        w = tl.exp2(m - mx)  # 0 for empty splits (m = -inf)
        den = tl.reduce(l_s * w, 0, _add)
        o = tl.reduce(acc * w[:, None], 0, _add) / den
        tl.store(OUT + b * s_ob + h * HD + d, o.to(OUT.dtype.element_ty), mask=dm)


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


# --pdl on: the K tiles of W a GEMM/GEMV program prefetches into L2 before its wait (HFSERVE_PDL_PREFETCH: another
# count, 0 = none; benchmarks/gpu/pdl_b1.sh measures batch 1 with and without it)
PDL_PREFETCH = int(os.environ.get("HFSERVE_PDL_PREFETCH", "4"))
_PDL = {"on": False}


def set_pdl(on: bool) -> None:
    """``--pdl on``: launch the decode step's Triton kernels (the norms, RoPE + KV store, decode attention and its
    reduction, SwiGLU, the GEMVs and skinny GEMMs with split-K's reduction) with programmatic dependent launch (Hopper,
    sm_90+), each waiting for the kernel before it first (``_pdl_wait``). Process-wide, as the launch tables are."""
    _PDL["on"] = bool(on)


def pdl_on() -> bool:
    """Whether :func:`set_pdl` turned programmatic dependent launch on."""
    return _PDL["on"]


@contextlib.contextmanager
def pdl_paused(pause: bool = True) -> Iterator[None]:
    """The launches inside without --pdl's keywords where ``pause`` (the engine's batch-1 decode step: on the H200 its
    graph ran 0.43 ms slower with PDL, 4.43 against 4.00 ms, ib_show_h200_2026-12-05g.json; the H100 +0.06 ms), as
    set before after. One thread's: the engine's, which launches every decode step and capture."""
    was = _PDL["on"]
    _PDL["on"] = was and not pause
    try:
        yield
    finally:
        _PDL["on"] = was


def _pdl(t: torch.Tensor, block_k: int = 0) -> dict[str, Any]:
    """The launch keywords of --pdl on for a kernel over ``t``'s device: none when off or not on CUDA (the CPU
    interpreter runs today's launches), else PDL and ``launch_pdl``; ``block_k`` (a GEMM/GEMV's W tile width) adds
    the L2 prefetch of its first PDL_PREFETCH tiles, one address per 128-byte line."""
    if not (_PDL["on"] and t.is_cuda):
        return {}
    return {"PDL": True, "launch_pdl": True, **(pdl_prefetch_kw(block_k, t.element_size()) if block_k else {})}


def pdl_prefetch_kw(block_k: int, element_size: int) -> dict[str, int]:
    """A GEMM/GEMV launch's L2-prefetch keywords under --pdl on: its first PDL_PREFETCH tiles of W (``block_k``
    elements of ``element_size`` bytes wide), one address per 128-byte line."""
    return {"PF": PDL_PREFETCH, "PF_LINES": max(1, block_k * element_size // 128)}


def _need_triton() -> None:
    if not HAVE_TRITON:
        raise RuntimeError("the triton kernels need the triton package (pip install triton)")


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
          out: torch.Tensor | None, residual_out: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    _need_triton()
    N = x.shape[-1]
    x2 = _rows(x)
    y = out if out is not None else torch.empty_like(x)
    y2 = y.view(-1, N)
    if delta is None:
        d2, r, r2 = x2, None, x2
    else:
        d2 = _rows(delta)
        r = residual_out if residual_out is not None else torch.empty_like(x)
        r2 = r.view(-1, N)
    _rmsnorm_kernel[(x2.shape[0],)](x2, d2, w, r2, y2, x2.stride(0), d2.stride(0), r2.stride(0), y2.stride(0),
                                    N, float(eps), HAS_DELTA=delta is not None,
                                    BLOCK=triton.next_power_of_2(N), num_warps=4 if N <= 4096 else 8, **_pdl(x2))
    return r, y


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton RMSNorm over the last dim (one program per row); ``out`` may be preallocated."""
    return _norm(x, None, w, eps, out, None)[1]


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float,
                out: torch.Tensor | None = None,
                residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass: (x + delta, rmsnorm(x + delta) * w). ``residual_out=x`` updates the residual in place."""
    r, y = _norm(x, delta, w, eps, out, residual_out)
    return r, y


def silu_mul(gu: torch.Tensor, inter: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton silu(gu[..., :inter]) * gu[..., inter:]."""
    _need_triton()
    g2 = _rows(gu)
    o = out if out is not None else torch.empty(*gu.shape[:-1], inter, dtype=gu.dtype, device=gu.device)
    o2 = o.view(-1, inter)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(inter, block))](g2, o2, g2.stride(0), o2.stride(0), inter,
                                                              BLOCK=block, num_warps=4, **_pdl(g2))
    return o


ROPE_ROWS = 16  # prefill rows per rope_store program (one head): 2048 elements over 4 warps
ROPE_ROWS_MIN = 256  # from this many rows (a prefill's) rope_store runs ROPE_ROWS rows per program


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
               K: torch.Tensor, V: torch.Tensor, layer: int, q_out: torch.Tensor | None = None,
               slots: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:
    """Triton RoPE of B rows' q and k plus the KV-pool store at (``slots[b]``, ``pos[b]``), in one
    launch; returns q [B, nh, hd]. ``slots`` None: row b is slot b (a decode step).

    ``rows`` per program (one head each): 1 is one program per (row, head), the decode step's; a
    prefill's rows (``slots`` given, at least ``ROPE_ROWS_MIN`` of them) default to ``ROPE_ROWS``,
    the same arithmetic in programs big enough to stream at bandwidth (H200, 4096 rows: the
    one-warp programs moved ~100 MB per layer in ~100 us, ~1 TB/s)."""
    _need_triton()
    B, nkv, hd = qkv.shape[0], K.shape[2], K.shape[4]
    nh = qkv.shape[-1] // hd - 2 * nkv
    assert qkv.stride(-1) == 1 and cos.stride(-1) == 1 and sin.stride() == cos.stride()
    assert K.stride() == V.stride() and K.stride(-1) == 1
    q = q_out if q_out is not None else torch.empty(B, nh, hd, dtype=qkv.dtype, device=qkv.device)
    KL, VL = K[layer], V[layer]  # views: the layer offset is folded into the pointer on the host
    if rows is None:
        rows = ROPE_ROWS if slots is not None and B >= ROPE_ROWS_MIN else 1
    if rows > 1:
        assert slots is not None, "the rows kernel is prefill's: it takes each row's slot"
        _rope_store_rows_kernel[(triton.cdiv(B, rows), nh + nkv)](
            qkv, cos, sin, pos, slots, q, KL, VL, B, qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1),
            KL.stride(0), KL.stride(1), KL.stride(2), NH=nh, NKV=nkv, HD=hd, BLOCK_D=triton.next_power_of_2(hd),
            ROWS=rows, KV_EMU=_kv_emu(K), num_warps=4)
        return q
    _rope_store_kernel[(B, nh + nkv)](qkv, cos, sin, pos, pos if slots is None else slots, q, KL, VL,
                                      qkv.stride(0), cos.stride(0),
                                      q.stride(0), q.stride(1), KL.stride(0), KL.stride(1), KL.stride(2),
                                      NH=nh, NKV=nkv, HD=hd, BLOCK_D=triton.next_power_of_2(hd), num_warps=1,
                                      HAS_SLOT=slots is not None, KV_EMU=_kv_emu(K), **_pdl(qkv))
    return q


GEMV_MAX_ROWS = 16  # the fused GEMVs pad the batch to one 16-row MMA tile: batch buckets up to 16


def _kv_emu(K: torch.Tensor) -> bool:
    """_kv_cast's KV_EMU: an fp8 pool off the GPU (the interpreter), where the rounding is done by hand."""
    return K.dtype == torch.float8_e4m3fn and not K.is_cuda


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


@dataclass(frozen=True)
class AttnCfg:
    """decode_attn's launch parameters; 0 keeps today's rule for that parameter."""

    splits: int = 0  # context splits; 0: split_count(B, kv heads, ctx) on this GPU; 1: the single-pass kernel
    block_n: int = 0  # cache columns per step; 0: 64 unsplit, split: the chunk's power of two in 16..64
    warps: int = 4
    stages: int = 2
    lowp: bool = False  # dots in the cache's dtype (bf16 MMA) instead of K/V widened to float32 (tf32)
    reg: bool = False  # lowp over an fp8 pool: K/V widened in registers before shared memory (LOWP 3), not
    # after (the compiler's placement: byte loads from shared memory on sm_90). Timed on the H200 (2026-12-04,
    # mm_attn_fp8_2026-12-04d.json): no faster (no reg launch among the finalists; the fp8 kernel is not bytes-bound).

    def label(self) -> str:
        return (f"s{self.splits or 'auto'}n{self.block_n or 'auto'}w{self.warps}st{self.stages}{'b' if self.lowp else ''}"
                f"{'r' if self.reg else ''}")

    def lowp_mode(self, q: torch.Tensor, K: torch.Tensor | None = None) -> int:
        """The kernels' LOWP: 0 (float32 dots), 1 (bf16/fp16 MMA, CUDA), 2 (the same arithmetic interpreted),
        3 (1 over an fp8 pool ``K``, widened in registers: ``reg``)."""
        if not self.lowp or q.dtype == torch.float32:
            return 0
        if not q.is_cuda:
            return 2
        return 3 if self.reg and K is not None and K.dtype == torch.float8_e4m3fn else 1


# Per (batch bucket, context bucket), from the running GPU's tables (``load_tables``; tables/<GPU>.json):
# decode attention's launch over a bf16 pool. Empty: every launch is today's (ATTN_DEFAULT).
ATTN_CONFIGS: dict[tuple[int, int], AttnCfg] = {}
ATTN_DEFAULT = AttnCfg()


def attn_config(B: int, ctx: int) -> AttnCfg:
    """decode_attn's launch parameters for B rows over context bucket ``ctx``: the table's or today's."""
    return ATTN_CONFIGS.get((B, ctx), ATTN_DEFAULT)


# --decode-attn lowp: K/V dots in bf16 MMA at every (batch, context) bucket, with the launch the running GPU's
# tables list for the bucket (mm_bench.py's attention sweep; ATTN_LOWP_DEFAULT elsewhere). Rounding changes (q and
# the cache's bf16 products in MMA, not widened to tf32): a knob the gates judge.
ATTN_LOWP: dict[tuple[int, int], AttnCfg] = {}
ATTN_LOWP_DEFAULT = AttnCfg(lowp=True)
# The same over an fp8 pool (--kv-cache-dtype fp8), where the tables list the bucket (mm_bench.py --attn-only
# --kv fp8); an unlisted bucket takes ATTN_LOWP's launch.
ATTN_LOWP_FP8: dict[tuple[int, int], AttnCfg] = {}
DECODE_ATTN = ("default", "lowp", "lowp-reg")
"""--decode-attn's choices: ``default`` (ATTN_CONFIGS, else today's launch), ``lowp``, or ``lowp-reg``
(``lowp`` with an fp8 pool's tiles widened in registers, AttnCfg.reg; the same as ``lowp`` over a bf16 pool)."""


def decode_attn_config(how: str, B: int, ctx: int, kv_fp8: bool = False) -> AttnCfg:
    """The AttnCfg the engine launches decode attention with under ``--decode-attn how`` (over an fp8 pool:
    ``kv_fp8``, ATTN_LOWP_FP8's launch where it lists the bucket)."""
    if how in ("lowp", "lowp-reg"):
        cfg = (kv_fp8 and ATTN_LOWP_FP8.get((B, ctx))) or ATTN_LOWP.get((B, ctx), ATTN_LOWP_DEFAULT)
        return replace(cfg, reg=True) if how == "lowp-reg" else cfg
    if how == "default":
        return attn_config(B, ctx)
    raise ValueError(f"unknown decode attention {how!r}; choose from {list(DECODE_ATTN)}")


_SM_COUNT: dict[int, int] = {}


def _programs_target(device: torch.device) -> int:
    """Programs one launch needs to fill the GPU: its SM count (132 on an H200; 132 off the GPU too)."""
    if device.type != "cuda":
        return 132
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SM_COUNT:
        _SM_COUNT[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SM_COUNT[i]


def split_count(B: int, nkv: int, ctx: int, target: int = 132, min_cols: int = 128) -> int:
    """Context splits for decode attention: enough that ``B * nkv * splits >= target`` programs run,
    but no split shorter than ``min_cols`` cache columns (below that the second kernel costs more
    than the parallelism gives). 1 = no split (one program per (row, kv head), no reduction)."""
    want = -(-target // max(1, B * nkv))
    return max(1, min(want, ctx // min_cols))


def decode_attn_partials(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, layer: int, B: int, pos: torch.Tensor,
                         ctx: int, scale: float, splits: int,
                         cfg: AttnCfg = ATTN_DEFAULT) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split-KV pass one: per (row, q head, split) the float32 partial (max m in log2 units, sum l,
    accumulator acc): shapes [B, nh, S], [B, nh, S], [B, nh, S, hd]. Split ``i`` covers cache columns
    ``[i * chunk, (i + 1) * chunk)`` with ``chunk = ceil(ctx / S)`` rounded up to the block size
    (``cfg.block_n``, or the chunk's power of two in 16..64); ``cfg``'s warps and stages launch it."""
    _need_triton()
    nh, hd, nkv = q.shape[1], q.shape[2], K.shape[2]
    g = nh // nkv
    assert q.stride(-1) == 1 and K.stride() == V.stride() and K.stride(-1) == 1
    per = triton.cdiv(ctx, splits)
    block_n = cfg.block_n or min(64, max(16, triton.next_power_of_2(per)))
    chunk = triton.cdiv(per, block_n) * block_n
    m = torch.empty(B, nh, splits, dtype=torch.float32, device=q.device)
    lsum = torch.empty_like(m)
    acc = torch.empty(B, nh, splits, hd, dtype=torch.float32, device=q.device)
    KL, VL = K[layer], V[layer]
    _decode_attn_split_kernel[(B, nkv, splits)](
        q, KL, VL, pos, m, lsum, acc, ctx, splits, chunk, float(scale) * 1.4426950408889634,
        q.stride(0), q.stride(1), KL.stride(0), KL.stride(1), KL.stride(2),
        NH=nh, G=g, HD=hd, BLOCK_G=max(16, triton.next_power_of_2(g)),
        BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_N=block_n,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", LOWP=cfg.lowp_mode(q, K), num_warps=cfg.warps,
        num_stages=cfg.stages, **_pdl(q))
    return m, lsum, acc


def combine_splits_ref(m: torch.Tensor, lsum: torch.Tensor, acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The torch reference of pass two: rescale every split to the common max, sum, normalise; [B, nh*hd]."""
    w = torch.exp2(m - m.amax(-1, keepdim=True))
    o = (acc * w[..., None]).sum(-2) / (lsum * w).sum(-1)[..., None]
    return o.reshape(m.shape[0], -1).to(dtype)


def combine_splits(m: torch.Tensor, lsum: torch.Tensor, acc: torch.Tensor, dtype: torch.dtype,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Split-KV pass two (Triton): the partials reduced across splits into [B, nh*hd]."""
    B, nh, S, hd = acc.shape
    o = out if out is not None else torch.empty(B, nh * hd, dtype=dtype, device=acc.device)
    _attn_reduce_kernel[(B, nh)](m, lsum, acc, o, o.stride(0), S, NH=nh, HD=hd,
                                 BLOCK_S=max(8, triton.next_power_of_2(S)),  # 8, 16, 32...: few compiles
                                 BLOCK_D=max(16, triton.next_power_of_2(hd)), num_warps=1, **_pdl(acc))
    return o


def decode_attn(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, layer: int, B: int, pos: torch.Tensor,
                ctx: int, scale: float, out: torch.Tensor | None = None, splits: int | None = None,
                cfg: AttnCfg | None = None) -> torch.Tensor:
    """Triton GQA flash-decoding over cache ``[0, min(pos[b] + 1, ctx))``; returns [B, nh*hd].

    ``splits`` (default: ``cfg.splits``, else :func:`split_count` for this B, kv heads and context bucket
    on this GPU) cuts the context into that many slices, one program each, reduced by a second small
    kernel (split-KV); 1 runs the single-pass kernel. ``cfg`` (default: :func:`attn_config`, today's
    launch unless ATTN_CONFIGS has this (B, ctx)) sets the block size, warps and pipeline stages. The
    choice depends only on host ints, so a graph captured per (batch, context) bucket holds a fixed plan.
    """
    _need_triton()
    nh, hd, nkv = q.shape[1], q.shape[2], K.shape[2]
    g = nh // nkv
    cfg = cfg if cfg is not None else attn_config(B, ctx)
    if splits is None:
        splits = cfg.splits or split_count(B, nkv, ctx, _programs_target(q.device))
    if splits > 1:
        return combine_splits(*decode_attn_partials(q, K, V, layer, B, pos, ctx, scale, splits, cfg), q.dtype, out)
    assert q.stride(-1) == 1 and K.stride() == V.stride() and K.stride(-1) == 1
    o = out if out is not None else torch.empty(B, nh * hd, dtype=q.dtype, device=q.device)
    KL, VL = K[layer], V[layer]
    # tl.dot wants every dim >= 16 on the GPU; padded query rows are zeros and never stored.
    _decode_attn_kernel[(B, nkv)](q, KL, VL, pos, o, ctx, float(scale) * 1.4426950408889634,
                                  q.stride(0), q.stride(1), KL.stride(0), KL.stride(1), KL.stride(2), o.stride(0),
                                  G=g, HD=hd, BLOCK_G=max(16, triton.next_power_of_2(g)),
                                  BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_N=cfg.block_n or 64,
                                  PREC="ieee" if q.dtype == torch.float32 else "tf32", LOWP=cfg.lowp_mode(q, K),
                                  num_warps=cfg.warps, num_stages=cfg.stages, **_pdl(q))
    return o


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


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


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


# -- selector -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ops:
    """The decode step's non-GEMM work, as one backend implements it."""

    name: str
    rmsnorm: Callable[..., torch.Tensor]
    add_rmsnorm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[..., torch.Tensor]
    rope_store: Callable[..., torch.Tensor]
    decode_attn: Callable[..., torch.Tensor]


_OPS = {
    "torch": Ops("torch", rmsnorm_ref, add_rmsnorm_ref, silu_mul_ref, rope_store_ref, decode_attn_ref),
    "triton": Ops("triton", rmsnorm, add_rmsnorm, silu_mul, rope_store, decode_attn),
    # The same ops; FastModel's decode step at batch <= GEMV_MAX_ROWS additionally runs the QKV and
    # gate/up GEMMs as norm_qkv_rope / norm_gu_silu (norm in the prologue, RoPE + KV store or SwiGLU
    # in the epilogue): 6 launches per layer instead of 10.
    "triton-gemv": Ops("triton-gemv", rmsnorm, add_rmsnorm, silu_mul, rope_store, decode_attn),
    # The same ops; FastModel's decode step at batch <= MV_MAX_ROWS runs its five projections (QKV, O,
    # gate/up, down, lm_head) through mv_linear (a plain Triton GEMV) instead of cuBLAS.
    "triton-mv": Ops("triton-mv", rmsnorm, add_rmsnorm, silu_mul, rope_store, decode_attn),
    # triton-mv, and at decode batch 2..64 the projections through mm_linear (the skinny Triton GEMM where
    # MM_CONFIGS lists the shape, else cuBLAS): FastModel's lin is mmv_linear.
    "triton-mm": Ops("triton-mm", rmsnorm, add_rmsnorm, silu_mul, rope_store, decode_attn),
}


def get_ops(name: str) -> Ops:
    """``"torch"`` (FastModel's current arithmetic), ``"triton"`` (the fused kernels), ``"triton-gemv"``
    (the same, and the decode step's QKV and gate/up GEMVs fused with their neighbours), ``"triton-mv"``
    (``triton``, and the decode step's projections at batch 1 as plain Triton GEMVs: :func:`mv_linear`) or
    ``"triton-mm"`` (``triton-mv``, and at batch 2..64 the skinny GEMM where tuned: :func:`mmv_linear`)."""
    if name not in _OPS:
        raise ValueError(f"unknown kernels {name!r}; choose from {sorted(_OPS)}")
    if name != "torch":
        _need_triton()
    return _OPS[name]


# -- the tuned launch tables, per GPU -----------------------------------------------------------------

TABLE_KINDS = {"MV_CONFIGS": MvCfg, "MM_CONFIGS": MmCfg, "MM_GLU_CONFIGS": MmCfg, "MM_FUSE_CONFIGS": MmCfg,
               "ATTN_CONFIGS": AttnCfg, "ATTN_LOWP": AttnCfg, "ATTN_LOWP_FP8": AttnCfg}
"""The launch tables (module globals, read at each launch) and their config types."""


def tables_for(device: str | None) -> dict[str, dict[tuple, Any]]:
    """The launch tables tuned for the GPU named ``device`` (torch.cuda.get_device_name) from its file in
    tables/ (hfserve.tables); every table empty (the defaults) for a GPU without one, or for None."""
    if device is None:
        return {name: {} for name in TABLE_KINDS}
    return read_tables(table_path(device), TABLE_KINDS)


def load_tables(device: str | None) -> dict[str, dict[tuple, Any]]:
    """Install :func:`tables_for` ``device`` as this module's tables; returns them."""
    found = tables_for(device)
    globals().update(found)
    return found
