"""RoPE + KV store: ``rope_store`` rotates q and k (rotate-half) and writes k and v into the KV pool in one launch,
for decode rows and for packed prefill rows (``ROPE_ROWS`` rows of a head per program from ``ROPE_ROWS_MIN`` rows).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops need no triton
    triton = None

from .launch import HAVE_TRITON, _add, _fmax, _into, _kv_emu, _need_triton, _pdl, _pdl_wait  # noqa: F401


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



if HAVE_TRITON:
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


else:
    _kv_cast = None

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


