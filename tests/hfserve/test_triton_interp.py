"""triton_interp's vectorised tl.reduce gives bit for bit what Triton's interpreter gives element by element."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
from triton_interp import import_interpreted  # noqa: E402  (beside this file)

K = None  # the interpreted kernels module (the kernel below reads its combine functions as a global)


def _kernel():
    import triton.language as tl

    global K
    K = import_interpreted()  # also installs the vectorised reduce
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        @triton.jit
        def reduce_kernel(X, S0, S1, M0, M1, V, K0, R: tl.constexpr, C: tl.constexpr):
            r = tl.arange(0, R)
            c = tl.arange(0, C)
            x = tl.load(X + r[:, None] * C + c[None, :])
            tl.store(S0 + c, tl.reduce(x, 0, K._add))
            tl.store(S1 + r, tl.reduce(x, 1, K._add))
            tl.store(M0 + c, tl.reduce(x, 0, K._fmax))
            tl.store(M1 + r, tl.reduce(x, 1, K._fmax))
            row = tl.load(X + c)
            tl.store(V + tl.arange(0, 2), tl.full([2], 0.0, tl.float32) + tl.reduce(row * row, 0, K._add))
            tl.store(K0 + r[:, None] * C + c[None, :], tl.reduce(x, 1, K._fmax, keep_dims=True) + tl.full([R, C], 0.0, tl.float32))
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    return reduce_kernel


def test_vectorised_reduce_is_bit_for_bit_the_interpreters() -> None:
    from triton.runtime.interpreter import ReduceOps

    kernel = _kernel()
    R, C = 8, 32
    g = torch.Generator().manual_seed(0)
    # magnitudes from 1e-6 to 1e6, so a different summation order would round differently; some -inf
    x = torch.randn(R, C, generator=g) * 10.0 ** torch.randint(-6, 7, (R, C), generator=g).float()
    x[2, 5] = x[6, 0] = float("-inf")
    x[2, :] = torch.where(torch.arange(C) == 5, x[2, :], x[2, :].abs())  # row 2's sum stays -inf, not nan

    def run() -> list[np.ndarray]:
        outs = [torch.empty(C), torch.empty(R), torch.empty(C), torch.empty(R), torch.empty(2), torch.empty(R, C)]
        kernel[(1,)](x, *outs, R=R, C=C)
        return [o.numpy().copy() for o in outs]

    fast = run()
    vectorised = ReduceOps.generic_reduce
    ReduceOps.generic_reduce = ReduceOps._slow_generic_reduce
    try:
        slow = run()
    finally:
        ReduceOps.generic_reduce = vectorised
    for f, s in zip(fast, slow, strict=True):
        assert f.shape == s.shape and np.array_equal(f.view(np.int32), s.view(np.int32))
    assert np.array_equal(fast[5], np.repeat(fast[3][:, None], C, axis=1))  # keep_dims: [R, 1] broadcast
    # and they are the reductions: sums close to float64's, maxima exact
    assert np.allclose(fast[1][np.isfinite(fast[1])], x.double().sum(1).numpy()[np.isfinite(fast[1])], rtol=1e-5)
    assert np.array_equal(fast[2], x.max(0).values.numpy()) and np.array_equal(fast[3], x.max(1).values.numpy())
    assert fast[0][0] == -np.inf and fast[1][2] == -np.inf
