"""Speed of light on this GPU: measure copy bandwidth and bf16 matrix rate, then floor each scenario.

    python benchmarks/gpu/sol.py --scenarios benchmarks/gpu/scenarios.toml --out sol.json

A floor is the larger of (FLOPs / matrix rate) and (bytes that must move / copy bandwidth) for
the model's shape (a Llama/Mistral config; default the forge's 7b-peaked preset):
* A (TTFT): one prefill of P tokens: 2*N*P FLOPs for the weights + causal attention, weights read once.
* B (TPOT): one decode step at batch 1: the weights plus the sequence's KV read once.
* C (output tok/s): R requests of P prompt / O output tokens: the prefill FLOPs of all prompts, and
  at least O sequential decode steps that each read the weights: floor time = max of the two.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import tomllib
import torch


def measure(gib: float = 4.0, n: int = 8192, reps: int = 20) -> dict[str, float]:
    """Device-to-device copy bandwidth (bytes read + written) and bf16 GEMM rate, medians."""
    def timed(fn, reps: int) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1000)
        return sorted(times)[len(times) // 2]

    src = torch.randn(int(gib * 2**30) // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), reps)
    bw = 2 * src.numel() * 2 / t
    src = dst = None  # free before the GEMM buffers
    x = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")  # random, not zeros (zeros run faster)
    y = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    t = timed(lambda: x @ y, reps)
    return {"copy_bytes_per_s": bw, "bf16_flops_per_s": 2 * n**3 / t, "gpu": torch.cuda.get_device_name()}


def model_numbers(cfg: dict) -> dict[str, float]:
    """Parameter count and per-token sizes of a Llama-family config."""
    d, f, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // h
    per_layer = d * (h * hd) + 2 * d * (kv * hd) + (h * hd) * d + 3 * d * f
    matmul_params = L * per_layer + v * d  # the LM head is a matmul; the embedding is a lookup
    weights = (matmul_params + v * d) * 2  # bf16/fp16 bytes, embedding included
    return {"matmul_params": matmul_params, "weight_bytes": weights, "layers": L, "d_attn": h * hd,
            "kv_bytes_per_token": 2 * L * kv * hd * 2}


def floors(scen: dict, m: dict, ceil: dict) -> dict[str, float]:
    bw, rate = ceil["copy_bytes_per_s"], ceil["bf16_flops_per_s"]
    N, L, da = m["matmul_params"], m["layers"], m["d_attn"]
    out = {}
    a = scen["prefill"]
    P = a["prompt_tokens"]
    fl = 2 * N * P + 2 * L * P * P * da  # QK^T and PV, causal half of 4*L*P^2*d
    out["prefill_ttft_ms"] = 1000 * max(fl / rate, m["weight_bytes"] / bw)
    b = scen["decode"]
    ctx = b["prompt_tokens"] + b["output_tokens"] / 2
    out["decode_tpot_ms"] = 1000 * max((m["weight_bytes"] + ctx * m["kv_bytes_per_token"]) / bw, 2 * N / rate)
    c = scen["throughput"]
    R, P, n_out = c["num_requests"], c["prompt_tokens"], c["output_tokens"]
    t = max(R * (2 * N * P + 2 * L * P * P * da) / rate, n_out * m["weight_bytes"] / bw)
    out["throughput_tok_s"] = R * n_out / t
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=str(Path(__file__).with_name("scenarios.toml")))
    ap.add_argument("--config", default="", help="model config.json (default: the 7b-peaked preset's shape)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.config:
        cfg = json.loads(Path(args.config).read_text())
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from orchestrator.models.forge import PRESETS

        p = PRESETS["7b-peaked"]
        cfg = {k: getattr(p, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                           "vocab_size", "num_attention_heads", "num_key_value_heads")}
    ceil = measure()
    m = model_numbers(cfg)
    scen = tomllib.loads(Path(args.scenarios).read_text())
    res = {"ceilings": ceil, "model": m, "floors": floors(scen, m, ceil)}
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    assert math.isfinite(ceil["copy_bytes_per_s"])


if __name__ == "__main__":
    main()
