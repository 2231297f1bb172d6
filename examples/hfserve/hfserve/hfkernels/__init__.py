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

Modules, by kind: ``norms``, ``rope``, ``attention``, ``gemv``, ``gemm``, and ``launch`` (what they share: Triton's
presence, the interpreter's shims, PDL). This package's namespace holds every name of every one of them.
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..tables import read_tables, table_path
from . import attention, gemm, gemv, launch, norms, rope
from .attention import AttnCfg, decode_attn, decode_attn_ref
from .gemm import MmCfg
from .gemv import MvCfg
from .launch import _need_triton
from .norms import add_rmsnorm, add_rmsnorm_ref, rmsnorm, rmsnorm_ref, silu_mul, silu_mul_ref
from .rope import rope_store, rope_store_ref

_KINDS = (launch, norms, rope, attention, gemv, gemm)
# One namespace for the engine, the tests and the benches: every name of every kernel module (its kernels, their
# launchers and launch configurations, the tables) read as ``hfkernels.NAME``; each module keeps its own binding.
for _m in _KINDS:
    globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})

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
    """Install :func:`tables_for` ``device`` as the kernels' tables (in the module each is read from, and here);
    returns them."""
    found = tables_for(device)
    for name, table in found.items():
        for m in _KINDS:
            if name in vars(m):
                setattr(m, name, table)
    globals().update(found)
    return found


def rebind(name: str, value: Any) -> Any:
    """Bind ``name`` to ``value`` here and in every kernel module that binds it (what each launcher reads: a stand-in
    for a kernel, a launcher or a table reaches every caller); returns the value it had here."""
    old = globals().get(name)
    for m in _KINDS:
        if name in vars(m):
            setattr(m, name, value)
    globals()[name] = value
    return old


def reloaded() -> Any:
    """The package re-imported from its modules, each kind's first (Triton's ``TRITON_INTERPRET`` is read when
    ``@triton.jit`` runs: the CPU interpreter's kernels for a process that imported the compiled ones)."""
    import importlib
    import sys

    for m in _KINDS:
        importlib.reload(m)
    return importlib.reload(sys.modules[__name__])
