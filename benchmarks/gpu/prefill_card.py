"""A's prefill on this card per choice the engine makes for it, and which choices this card's tables make.

    python benchmarks/gpu/prefill_card.py [--preset 7b-peaked] [--tokens 4096] [--prompts 1] [--reps 3]
        [--budget-s 75] [--out prefill_card.json]      # --device cpu --preset tiny --tokens 48: a smoke test

One prefill forward pass of ``--prompts`` prompts of ``--tokens`` tokens (InferenceBench's A: one of 4096) through the
fast engine's FastModel, on random weights of the forge preset's shape (the time depends on the shape only; no
forge), timed with CUDA events (median of ``--reps`` after a warm-up), per

* ``kernels``: torch or triton (the prefill's GEMMs are ``x @ w.t()`` under every kernels value: the tables' skinny
  Triton GEMMs serve 1..64 rows, a decode step; triton-mv and triton-mm prefill as triton does),
* ``prefill_attn``: torch, fused or fused-batched, and
* ``sdpa``: the engine's --sdpa values (auto leaves the backend to torch),

the served setting (engine step 14: triton-mm, fused-batched, sdpa auto) first and marked, the rest while
``--budget-s`` lasts. Then one layer's parts at that shape: each GEMM (cuBLAS) against this card's bf16 matrix rate
(an 8192^3 GEMM, measured here), the attention under every SDPA backend (cuDNN too) and the backend torch picks for
auto, RoPE + KV store at several rows per program; and what this card's tables choose for the prefill: the tables
file, where its numbers come from, each prefill GEMM's launch. One run says whether this card's prefill runs
choices tuned on another card, and where its time goes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]  # paths in the output are relative to the repository
SERVED = ("triton", "fused-batched", "auto")  # engine step 14's prefill (--kernels triton-mm prefills as triton)
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def timer(device: torch.device, reps: int):
    """``time(fn)``: fn's median milliseconds over ``reps`` runs after one warm-up (CUDA events on a GPU)."""
    cuda = device.type == "cuda"

    def time_it(fn) -> float:
        fn()
        out = []
        for _ in range(reps):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1000)
        return statistics.median(out)
    return time_it


def random_model(preset: str, device: torch.device, dtype: torch.dtype) -> Any:
    """A LlamaForCausalLM of the forge preset's shape with random weights, born on ``device`` in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from orchestrator.models.forge import PRESETS

    p = PRESETS[preset]
    cfg = LlamaConfig(vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
                      num_hidden_layers=p.num_hidden_layers, num_attention_heads=p.num_attention_heads,
                      num_key_value_heads=p.num_key_value_heads, max_position_embeddings=p.max_position_embeddings,
                      rope_theta=p.rope_theta, rms_norm_eps=1e-5, tie_word_embeddings=False)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(previous)


def whole(fm: Any, parts: list, time_it, budget_end: float) -> list[dict[str, Any]]:
    """The whole prefill per (kernels, prefill_attn, sdpa): the served setting first."""
    from hfserve.fast.model import _SDPA, PREFILL_ATTN

    combos = [(k, a, s) for k in ("triton", "torch") for a in PREFILL_ATTN for s in _SDPA if s != "math"]
    combos += [(k, a, "math") for k in ("triton", "torch") for a in PREFILL_ATTN]  # slowest last
    combos.remove(SERVED)
    rows = []
    for kernels, attn, sdpa in [SERVED, *combos]:
        row: dict[str, Any] = {"kernels": kernels, "prefill_attn": attn, "sdpa": sdpa, "served": (kernels, attn, sdpa) == SERVED}
        if time.monotonic() > budget_end:
            row["skipped"] = "out of --budget-s"
        else:
            try:
                fm.sdpa = sdpa
                fm.set_kernels(kernels)
                fm.set_prefill_attn(attn)
                row["ms"] = time_it(lambda: fm.prefill_packed(parts))
            except (ValueError, RuntimeError) as exc:  # a combination the engine refuses, or torch cannot run
                row["refused"] = str(exc).splitlines()[0][:140]
        rows.append(row)
        shown = f"{row['ms']:9.2f} ms" if "ms" in row else row.get("refused") or row.get("skipped")
        print(f"  {kernels:7s} {attn:14s} {sdpa:10s} {shown}{'   <- served (step 14)' if row['served'] else ''}",
              flush=True)
    return rows


def layer_parts(fm: Any, tokens: int, time_it, rate: float | None) -> dict[str, Any]:
    """One layer's parts at ``tokens`` rows: GEMMs, attention per SDPA backend, RoPE + store per rows a program."""
    from hfserve import hfkernels as K
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    L, dev, dt = fm.layers[0], fm.device, fm.dtype
    x = torch.randn(tokens, fm.cfg.hidden_size, device=dev, dtype=dt)
    act = torch.randn(tokens, fm.inter, device=dev, dtype=dt)
    attn_in = torch.randn(tokens, fm.nh * fm.hd, device=dev, dtype=dt)
    gemms = {}
    for name, inp, w in (("qkv", x, L["qkv"]), ("o", attn_in, L["o"]), ("gate_up", x, L["gu"]), ("down", act, L["down"])):
        ms = time_it(lambda inp=inp, w=w: inp @ w.t())
        flops = 2 * tokens * w.shape[0] * w.shape[1]
        gemms[name] = {"n": w.shape[0], "k": w.shape[1], "ms": ms, "tflop_s": flops / ms / 1e9,
                       "of_rate": flops / ms / 1e-3 / rate if rate else None}
    q = torch.randn(1, fm.nh, tokens, fm.hd, device=dev, dtype=dt)
    kc, vc = fm.K[0, :1, :, :tokens], fm.V[0, :1, :, :tokens]
    mask = causal_lower_right(tokens, tokens)
    attn_flops = 2 * fm.nh * tokens * tokens * fm.hd  # causal half of 4 * nh * T^2 * hd
    attention = {}
    for name in ("auto", *BACKENDS):
        ctx = nullcontext() if name == "auto" else sdpa_kernel([getattr(SDPBackend, name)])
        try:
            with ctx:
                ms = time_it(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=fm.scale,
                                                                    enable_gqa=True))
            attention[name] = {"ms": ms, "tflop_s": attn_flops / ms / 1e9}
        except RuntimeError as exc:
            attention[name] = {"refused": str(exc).splitlines()[0][:140]}
    attention["auto"]["picks"] = _picked(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask,
                                                                                scale=fm.scale, enable_gqa=True))
    rope = {}
    if K.HAVE_TRITON and (dev.type == "cuda" or _interpreting()):
        qkv = torch.randn(tokens, (fm.nh + 2 * fm.nkv) * fm.hd, device=dev, dtype=dt)
        pos = torch.arange(tokens, device=dev)
        slots = torch.zeros(tokens, dtype=torch.long, device=dev)
        for rows in (1, 4, 8, 16, 32):
            rope[rows] = time_it(lambda rows=rows: K.rope_store(qkv, fm.cos, fm.sin, pos, fm.K, fm.V, 0,
                                                                 slots=slots, rows=rows))
    return {"gemms": gemms, "attention": attention, "rope_store_ms_by_rows": rope, "rope_rows_default": K.ROPE_ROWS}


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def _picked(fn) -> str:
    """The attention kernel torch runs for ``fn`` (its longest-running kernel or op with attention in its name)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    keys = ("attn", "fmha", "flash", "sdpa", "attention", "softmax")
    names = [e for e in prof.key_averages() if any(k in e.key.lower() for k in keys)]
    dev = [e for e in names if getattr(e, "device_time_total", 0) > 0]
    best = max(dev or names, key=lambda e: getattr(e, "device_time_total", 0) or e.cpu_time_total, default=None)
    return best.key[:120] if best else "?"


def card_tables(fm: Any, tokens: int, device: str | None) -> dict[str, Any]:
    """What the tables of the GPU named ``device`` (None: no GPU) choose for a prefill of ``tokens`` rows: the file,
    where its numbers come from, each prefill GEMM's launch (installs them, as the engine does on that GPU)."""
    from hfserve import hfkernels as K
    from hfserve.fast.model import sdpa_backends
    from hfserve.tables import table_path

    path = table_path(device) if device else None
    found = K.load_tables(device)
    data = json.loads(path.read_text()) if path and path.exists() else {}
    sources = {name: t.get("source", "") for name, t in data.get("tables", {}).items()}
    L = fm.layers[0]
    launches = {}
    for name, w in (("qkv", L["qkv"]), ("o", L["o"]), ("gate_up", L["gu"]), ("down", L["down"])):
        cfg = K.mm_config(tokens, w.shape[0], w.shape[1])
        launches[name] = cfg.label() if cfg else f"cuBLAS (the tables' skinny GEMM serves 1..{K.MM_ROWS[-1]} rows)"
    shown = path.resolve().relative_to(ROOT) if path and path.resolve().is_relative_to(ROOT) else path
    return {"device": device, "file": str(shown) if path else None, "file_exists": bool(path and path.exists()),
            "entries": {name: len(t) for name, t in found.items()}, "sources": sources, "prefill_gemms": launches,
            "sdpa_auto_one_prompt": sdpa_backends("auto", False, fm.device.type) or "torch's own choice",
            "sdpa_auto_batched": sdpa_backends("auto", True, fm.device.type) or "torch's own choice"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="7b-peaked", help="forge preset whose shape to build (random weights)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per prompt (A: 4096)")
    ap.add_argument("--prompts", type=int, default=1, help="prompts in the packed pass (A: 1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=75, help="stop adding whole-pass rows after this many seconds")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    from hfserve.fast import FastModel

    device = torch.device(a.device)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.inference_mode():
        fm = FastModel(random_model(a.preset, device, dt), slots=a.prompts, capacity=a.tokens)
        time_it = timer(device, a.reps)
        rate = None
        if device.type == "cuda":
            m = torch.randn(8192, 8192, device=device, dtype=dt)
            rate = 2 * 8192 ** 3 / time_it(lambda: m @ m) / 1e-3
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"{name}: {a.preset} shape, {a.prompts} prompt(s) x {a.tokens} tokens, {fm.cfg.num_hidden_layers} layers"
              + (f"; bf16 matrix rate {rate / 1e12:.0f} TFLOP/s (8192^3)" if rate else ""), flush=True)
        gen = torch.Generator().manual_seed(1)
        parts = [(torch.randint(4, fm.cfg.vocab_size, (a.tokens,), generator=gen).to(device), s, 0)
                 for s in range(a.prompts)]
        tables = card_tables(fm, a.tokens * a.prompts, name if device.type == "cuda" else None)
        print("whole prefill (kernels, prefill_attn, sdpa):", flush=True)
        rows = whole(fm, parts, time_it, t0 + a.budget_s)
        fm.set_kernels("torch")
        parts_out = layer_parts(fm, a.tokens, time_it, rate)
    timed = [r for r in rows if "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    served = next((r for r in rows if r["served"] and "ms" in r), None)
    print("one layer at these rows:", flush=True)
    for g, r in parts_out["gemms"].items():
        of = f", {r['of_rate']:.0%} of the matrix rate" if r["of_rate"] else ""
        print(f"  GEMM {g:8s} [{a.tokens} x {r['k']}] @ [{r['k']} x {r['n']}]: {r['ms']:7.3f} ms, "
              f"{r['tflop_s']:6.1f} TFLOP/s{of}", flush=True)
    for b, r in parts_out["attention"].items():
        said = f"{r['ms']:7.3f} ms, {r['tflop_s']:6.1f} TFLOP/s" if "ms" in r else f"refused: {r['refused']}"
        print(f"  attention {b:20s} {said}" + (f"  (runs {r['picks']})" if "picks" in r else ""), flush=True)
    if parts_out["rope_store_ms_by_rows"]:
        print("  rope_store by rows a program: " + ", ".join(f"{k}: {v:.3f} ms" for k, v in
                                                          parts_out["rope_store_ms_by_rows"].items())
              + f" (the engine's: {parts_out['rope_rows_default']})", flush=True)
    print(f"this card's tables: {tables['file'] or 'none (no GPU): the defaults'}"
          + ("" if tables["file_exists"] or not tables["file"] else " (no such file: the defaults)"), flush=True)
    for tname, src in tables["sources"].items():
        print(f"  {tname}: {tables['entries'].get(tname, 0)} entries; {src[:110]}", flush=True)
    print(f"  prefill GEMMs at {a.tokens * a.prompts} rows: "
          + "; ".join(f"{k} {v}" for k, v in tables["prefill_gemms"].items()), flush=True)
    print(f"  SDPA under --sdpa auto: one prompt {tables['sdpa_auto_one_prompt']}; batched "
          f"{tables['sdpa_auto_batched']}", flush=True)
    if best and served:
        print(f"served (step 14) {served['ms']:.2f} ms; fastest {best['kernels']} {best['prefill_attn']} {best['sdpa']} "
              f"{best['ms']:.2f} ms ({served['ms'] / best['ms']:.2f}x)", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": name, "args": vars(a), "matrix_rate_flop_s": rate, "rows": rows,
                                           "best": best, "served": served, "layer": parts_out, "tables": tables},
                                          indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
