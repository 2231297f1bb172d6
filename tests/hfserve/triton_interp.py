"""Import hfserve.hfkernels with its Triton kernels interpreted (TRITON_INTERPRET=1), for CPU tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

HFSERVE = Path(__file__).resolve().parents[2] / "examples" / "hfserve"


def tree_env(env: dict[str, str] | None = None, *first: str) -> dict[str, str]:
    """``env`` (default os.environ) with ``first`` and hfserve's tree ahead on PYTHONPATH: what a subprocess
    running a bench script needs to import the package the tests import, installed or not."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*first, str(HFSERVE), env.get("PYTHONPATH")) if p)
    return env


def import_interpreted():
    """Import hfserve.hfkernels with TRITON_INTERPRET=1 (read when @triton.jit runs), then restore the env.

    Set at import rather than for the session, so the rest of a whole-suite run sees the env as it was.
    A kernels module imported earlier with compiled kernels (hfserve.fast imports it) is reloaded in
    place, so every holder of the module (FastModel's ``get_ops``) sees the interpreted kernels.
    """
    _vectorise_generic_reduce()
    _cache_np_dtypes()
    with interpreting():
        from hfserve import hfkernels as mod
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(mod._rmsnorm_kernel, InterpretedFunction):  # imported earlier, compiled
            mod = mod.reloaded()
        return mod


def patch_kernels(mp, kernels, name: str, value) -> None:
    """``mp.setattr`` (a pytest MonkeyPatch) of ``name`` on the kernels package and on every kernel module that
    binds it (hfserve.hfkernels.gemm, ...), so a test's stand-in is what every launcher reads."""
    mp.setattr(kernels, name, value)
    for kind in kernels._KINDS:
        if name in vars(kind):
            mp.setattr(kind, name, value)


@contextmanager
def interpreting() -> Iterator[None]:
    """TRITON_INTERPRET=1 inside (read when @triton.jit runs, and at each launch), as it was after."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def _vectorise_generic_reduce() -> None:
    """Triton 3.6's interpreter runs ``tl.reduce`` with a combine function of its own (hfserve.hfkernels'
    ``_add`` and ``_fmax``: see the note there) one element at a time: a Python call of the combine
    function per element, most of an interpreted decode step's time. Replace it, once per process,
    with the same left fold over the reduced axis done a whole slice at a time: ``acc = x[0]``, then
    ``acc = combine(acc, x[i])`` for i = 1 .. n-1, each combine on every output element at once.
    Elementwise the operations and their order are the interpreter's own, so the results are bit for
    bit its slow path's (``tests/examples/test_triton_interp.py`` checks that on both combine
    functions); only the number of Python calls changes (n - 1 instead of one per element)."""
    from triton.language import core as tlc
    from triton.runtime.interpreter import ReduceOps

    if getattr(ReduceOps, "_slow_generic_reduce", None) is not None:
        return

    def generic_reduce(self, given):
        original_axis = self.axis
        input, axis = self.unravel(given, self.axis)
        datas = [arg.handle.data for arg in input]
        shape = datas[0].shape
        acc = tuple(self.to_tensor(np.take(d, 0, axis=axis), arg.dtype) for d, arg in zip(datas, input, strict=True))
        for i in range(1, shape[axis]):
            x = tuple(self.to_tensor(np.take(d, i, axis=axis), arg.dtype) for d, arg in zip(datas, input, strict=True))
            ret = self.combine_fn.fn(*acc, *x)
            acc = ret if isinstance(ret, tuple) else (ret,)
            if not all(isinstance(a, tlc.tensor) for a in acc):  # a combine returning Python values
                return ReduceOps._slow_generic_reduce(self, given)
        out = []
        for a, d, arg in zip(acc, datas, input, strict=True):
            data = np.asarray(a.handle.data, dtype=d.dtype).reshape(shape[:axis] + shape[axis + 1:])
            if self.keep_dims:
                if original_axis is not None:
                    data = np.expand_dims(data, axis)
                else:
                    for _ in range(len(shape)):
                        data = np.expand_dims(data, 0)
            elif original_axis is None:
                data = data.item()
            out.append(self.to_tensor(data, arg.dtype))
        return out

    ReduceOps._slow_generic_reduce = ReduceOps.generic_reduce
    ReduceOps.generic_reduce = generic_reduce


def _cache_np_dtypes() -> None:
    """The interpreter's ``_get_np_dtype`` (called for every value it makes) builds its 17-entry
    table of Triton to numpy dtypes on every call. Look the same table up instead, filled from the
    function itself on first use of each dtype: the same answer for every dtype."""
    from triton import language as tl
    from triton.runtime import interpreter

    if getattr(interpreter, "_slow_get_np_dtype", None) is not None:
        return
    slow = interpreter._get_np_dtype
    table: dict = {}

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty  # the function's own block case: its element type's entry
        if isinstance(tt_dtype, tl.pointer_type):
            return slow(tt_dtype)
        np_dtype = table.get(tt_dtype)
        if np_dtype is None:
            np_dtype = table[tt_dtype] = slow(tt_dtype)
        return np_dtype

    interpreter._slow_get_np_dtype = slow
    interpreter._get_np_dtype = get_np_dtype


def same_rounding(got, want) -> bool:
    """Two launches that round at the same points give the same tensor: bit for bit where the output is 16 bits
    wide. In float32 the interpreter's tile dot is numpy's matmul, whose summation order follows the BLAS kernel this
    CPU picks for the tile's shape (a fused launch's half-width dots may take another), so there the two agree
    within a few float32 ulps (relative 1e-5) instead; a tile left out or a wrong rounding point is far beyond."""
    import torch

    if got.dtype != torch.float32:
        return torch.equal(got, want)
    return got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
