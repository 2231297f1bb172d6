"""C's prefill attention on the GPU: one SDPA call per prompt (the engine's) against one batched call.

    python benchmarks/gpu/prefill_attn_bench.py [--prompts 64] [--len 512] [--capacity 4608] [--reps 10] [--out F]

The packed prefill of C's burst (64 prompts of 512 tokens, each in its own KV slot) runs attention per prompt:
64 SDPA calls per layer, 2048 per pass (the H200 profile: cuDNN flash, 15.6 us each, 27.5 ms of a 28,160-token
pass). A batched call over the prompts' consecutive slots was tried once and served slower (reverted: a5c0ae6 ->
acac347), unexplained. This times one layer's attention every way on random bf16 tensors in the engine's
layouts (q rows from the RoPE kernel: [rows, heads, head_dim]; the KV pool [slots, kv_heads, capacity, head_dim]):
per prompt with the causal mask object (today) or ``is_causal``, batched on the pool's strided views or on
contiguous copies, under each SDPA backend; the device time (CUDA events around ``--reps`` layers), the host
time to issue one layer, and each way's largest difference from today's output. ``--device cpu`` with small
sizes: a smoke test.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

BACKENDS = {"auto": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def ways(q_rows: torch.Tensor, K: torch.Tensor, V: torch.Tensor, P: int, c: int, scale: float) -> dict:
    """name -> a function computing one layer's attention output [P * c, heads * head_dim]."""
    nh, hd = q_rows.shape[1], q_rows.shape[2]
    mask = causal_lower_right(c, c)

    def per_prompt(causal_flag: bool):
        def run():
            outs = []
            for p in range(P):
                q = q_rows[p * c:(p + 1) * c].transpose(0, 1)[None]
                kc, vc = K[p:p + 1, :, :c], V[p:p + 1, :, :c]
                o = (F.scaled_dot_product_attention(q, kc, vc, is_causal=True, scale=scale, enable_gqa=True)
                     if causal_flag else
                     F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=scale, enable_gqa=True))
                outs.append(o.transpose(1, 2).reshape(c, nh * hd))
            return torch.cat(outs)
        return run

    def batched(contig: bool):
        def run():
            q = q_rows.view(P, c, nh, hd).transpose(1, 2)
            kc, vc = K[:P, :, :c], V[:P, :, :c]
            if contig:
                q, kc, vc = q.contiguous(), kc.contiguous(), vc.contiguous()
            o = F.scaled_dot_product_attention(q, kc, vc, is_causal=True, scale=scale, enable_gqa=True)
            return o.transpose(1, 2).reshape(P * c, nh * hd)
        return run

    return {"per_prompt_mask": per_prompt(False), "per_prompt_causal": per_prompt(True),
            "batched_views": batched(False), "batched_contig": batched(True)}


def time_way(fn, reps: int, cuda: bool) -> tuple[float, float]:
    """(device ms per layer, host ms to issue one layer)."""
    fn()
    if cuda:
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps * 1000
    if not cuda:
        return host, host
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps, host


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--capacity", type=int, default=4608)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--first-counts", type=int, nargs="*", default=[9, 55, 63, 33],
                    help="prompt counts whose first batched call is timed (a new shape for the backend)")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    cuda = a.device.startswith("cuda")
    dt = torch.bfloat16 if cuda else torch.float32
    P, c = a.prompts, a.len
    g = torch.Generator(device=a.device).manual_seed(0)
    q_rows = torch.randn(P * c, a.heads, a.head_dim, device=a.device, dtype=dt, generator=g)
    K = torch.randn(P + 1, a.kv_heads, a.capacity, a.head_dim, device=a.device, dtype=dt, generator=g)
    V = torch.randn(P + 1, a.kv_heads, a.capacity, a.head_dim, device=a.device, dtype=dt, generator=g)
    scale = a.head_dim ** -0.5
    fns = ways(q_rows, K, V, P, c, scale)
    with torch.inference_mode():
        ref = fns["per_prompt_mask"]().float()
        rows = []
        for bname, backend in BACKENDS.items():
            if not cuda and bname != "auto":
                continue
            for wname, fn in fns.items():
                ctx = sdpa_kernel([backend]) if backend is not None else nullcontext()
                try:
                    with ctx:
                        err = (fn().float() - ref).abs().max().item()
                        dev_ms, host_ms = time_way(fn, a.reps, cuda)
                    rows.append({"backend": bname, "way": wname, "device_ms": dev_ms, "host_ms": host_ms, "max_err": err})
                except RuntimeError as exc:  # a backend that refuses these shapes / strides
                    rows.append({"backend": bname, "way": wname, "error": str(exc).splitlines()[0][:160]})
                r = rows[-1]
                print(f"{bname:9s} {wname:18s} " + (f"device {r['device_ms']:8.3f} ms  host {r['host_ms']:7.3f} ms"
                                                     f"  max err {r['max_err']:.3g}" if "error" not in r
                                                     else f"refused: {r['error']}"), flush=True)
        # A batched call's shape changes with the pass's prompt count: the first call at a new count, per
        # backend (cuDNN builds an execution plan per shape): the pass's one-time cost of batching.
        first = []
        for i, bname in enumerate(("cudnn", "flash", "auto") if cuda else ()):
            for n in (min(m + i, P) for m in a.first_counts):  # counts no backend has seen yet
                fn = ways(q_rows[:n * c], K, V, n, c, scale)["batched_views"]
                with sdpa_kernel([BACKENDS[bname]]) if BACKENDS[bname] is not None else nullcontext():
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    cold = (time.perf_counter() - t0) * 1000
                    t0 = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    warm = (time.perf_counter() - t0) * 1000
                first.append({"backend": bname, "prompts": n, "first_ms": cold, "second_ms": warm})
                print(f"{bname:9s} batched_views at {n:3d} prompts: first call {cold:8.3f} ms, second {warm:7.3f} ms",
                      flush=True)
    flops = 4 * P * a.heads * c * c * a.head_dim / 2
    print(f"one layer: {P} prompts x {c} tokens, {flops / 1e9:.1f} GFLOP causal; 32 layers x the best device ms"
          " = the pass's attention", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "gflop_per_layer": flops / 1e9, "rows": rows, "first": first}, indent=1))


if __name__ == "__main__":
    main()
