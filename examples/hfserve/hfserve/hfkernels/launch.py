"""Launch helpers shared by the kernels: Triton's presence and the CPU interpreter's shims, programmatic
dependent launch (``--pdl``: ``set_pdl``, the wait and the L2 prefetch every kernel starts with), and small
helpers (output copies, row views, an fp8 pool's emulation on the CPU).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch ops need no triton
    triton = None


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



# -- Triton helpers shared by the kernels ------------------------------------------------------

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


else:
    _add = _fmax = _pdl_wait = _l2_prefetch = _prefetch_w = None

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


def _kv_emu(K: torch.Tensor) -> bool:
    """_kv_cast's KV_EMU: an fp8 pool off the GPU (the interpreter), where the rounding is done by hand."""
    return K.dtype == torch.float8_e4m3fn and not K.is_cuda


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


