"""Norms and SwiGLU: ``rmsnorm``, ``add_rmsnorm`` (the residual add fused with the norm after it) and ``silu_mul``,
each beside its torch reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops need no triton
    triton = None

from .launch import HAVE_TRITON, _add, _fmax, _into, _need_triton, _pdl, _pdl_wait, _rows  # noqa: F401

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



if HAVE_TRITON:
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


