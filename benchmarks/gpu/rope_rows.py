"""Prefill's rope_store on the GPU, one (row, head) per program against ROPE_ROWS rows per program.

    python3 benchmarks/gpu/rope_rows.py [--rows 4096 32768] [--out rope_rows.json]

The 7B shape (32 q heads, 8 kv heads, head_dim 128, bf16), random q/k/v rows at positions 0..n-1 of
one slot (as A's 4096-token prefill) or spread over 64 slots of 512 (C's packed burst): both kernels'
time per call (CUDA events, median of 20 after 3 warm-ups), the bytes each call moves (qkv read, q and
the K/V rows written) over that time, and whether the two kernels' q, K and V are bit for bit equal.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
from check_engine import cuda_time as cuda_ms  # noqa: E402  (3 warm-ups, median of 20 CUDA-event times)
from hfserve import hfkernels as kernels  # noqa: E402

NH, NKV, HD, CAP = 32, 8, 128, 4864


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev, dt = torch.device("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    ang = torch.arange(CAP, device=dev).float()[:, None] * (1e4 ** (-torch.arange(0, HD, 2, device=dev).float() / HD))
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    res = []
    for n in a.rows:
        per = 512 if n > 4096 else n  # C: 64 prompts of 512 in 64 slots; A: one prompt of 4096
        slots_n = n // per
        qkv = torch.randn(n, (NH + 2 * NKV) * HD, device=dev, generator=g).to(dt)
        pos = torch.arange(per, device=dev).repeat(slots_n)
        slots = torch.arange(slots_n, device=dev).repeat_interleave(per)
        out: dict = {}
        for rows in (1, kernels.ROPE_ROWS):
            K = torch.zeros(2, slots_n, NKV, CAP, HD, device=dev, dtype=dt)
            V = torch.zeros_like(K)
            q = kernels.rope_store(qkv, cos, sin, pos, K, V, 1, slots=slots, rows=rows)
            ms = cuda_ms(functools.partial(kernels.rope_store, qkv, cos, sin, pos, K, V, 1, slots=slots, rows=rows))
            out[rows] = (q, K, V, ms)
        moved = qkv.numel() * 2 + n * (NH + 2 * NKV) * HD * 2  # read qkv; write q, k, v
        (q1, K1, V1, ms1), (qr, Kr, Vr, msr) = out[1], out[kernels.ROPE_ROWS]
        row = {"rows": n, "one_per_program_us": round(ms1 * 1000, 1), "rows_per_program_us": round(msr * 1000, 1),
               "rows_per_program": kernels.ROPE_ROWS, "tb_s": [round(moved / ms1 / 1e9, 2), round(moved / msr / 1e9, 2)],
               "x32_layers_ms": [round(ms1 * 32, 2), round(msr * 32, 2)],
               "bit_equal": bool(torch.equal(q1, qr) and torch.equal(K1, Kr) and torch.equal(V1, Vr))}
        print(json.dumps(row), flush=True)
        res.append(row)
    if a.out:
        Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "results": res}, indent=1))


if __name__ == "__main__":
    main()
