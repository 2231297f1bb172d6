"""Where the time goes in the best candidate: kernel time by kind for its prefill and decode steps.

    python benchmarks/gpu/profile_best.py MODEL_DIR --db infergoal.db [--out profile.json]

Takes the best kept trial's knobs from the database (dtype, SDPA backend, batch size), rebuilds
the fast engine's model, and with torch.profiler splits CUDA kernel time of (a) one 4096-token
prefill (scenario A) and (b) one decode step at batch 1 (B) and at the batch size (C) into GEMMs,
attention, and everything else; it also times the CUDA-graph replay of the same decode step, so
the gap between the graph's wall time and its kernel time is the launch/host overhead left.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hfserve"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_engine import cuda_time  # noqa: E402
from fastengine import FastModel, GraphDecoder  # noqa: E402


def best_knobs(db: str) -> dict:
    try:
        con = sqlite3.connect(db)
        row = con.execute("select knobs from trials where status='kept' and score is not null "
                          "order by score desc limit 1").fetchone()
        return json.loads(row[0]) if row else {}
    except sqlite3.Error:
        return {}


def kind(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "softmax")):
        return "attention"
    if any(k in n for k in ("gemm", "xmma", "cutlass", "nvjet", "matmul", "sm90")):
        return "gemm"
    return "other (norms, RoPE, elementwise, copies)"


def breakdown(fn) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            out[kind(ev.key)] += t / 1000
    return {k: round(v, 3) for k, v in out.items()}


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--db", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    knobs = best_knobs(args.db) if args.db else {}
    dtype = getattr(torch, knobs.get("dtype", "bfloat16"))
    batch = int(knobs.get("max_batch_size", 16)) if knobs.get("batching") == "on" else 1
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, device_map="cuda").eval()
    fm = FastModel(hf, slots=max(batch, 1) + 2, capacity=4608, sdpa=knobs.get("sdpa", "auto"))
    del hf
    res: dict = {"knobs": knobs, "profiled_batch": batch}
    long = torch.randint(4, 30000, (4096,), device="cuda")
    res["prefill4096_ms"] = cuda_time(lambda: fm.prefill(long, 0, 0), reps=5)
    res["prefill4096_kernels_ms"] = breakdown(lambda: fm.prefill(long, 0, 0))
    for b in sorted({1, batch}):
        dec = GraphDecoder(fm, b, use_graphs=True)
        toks, pos = [7] * b, [540] * b
        res[f"decode_b{b}_graph_ms"] = cuda_time(lambda d=dec, t=toks, p=pos: d.step(t, p))
        inp_t = torch.tensor(toks, device="cuda")
        inp_p = torch.tensor(pos, device="cuda")
        res[f"decode_b{b}_kernels_ms"] = breakdown(lambda t=inp_t, p=inp_p: fm.decode(t, p, 768))
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
