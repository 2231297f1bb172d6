"""Decode attention: flash-decoding over the KV pool that stops at each row's position, split-KV with the
splits' combination, dots in float32 or (``--decode-attn lowp``) in the cache's dtype; its launch configuration
(``AttnCfg``) and tables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops need no triton
    triton = None

from .launch import HAVE_TRITON, _add, _fmax, _into, _kv_emu, _need_triton, _pdl, _pdl_wait, _prefetch_w  # noqa: F401
from .rope import _kv_cast  # noqa: F401


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



if HAVE_TRITON:
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


