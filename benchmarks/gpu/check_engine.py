"""On the GPU: the fast engine against transformers on the forged 7B model, both kernel paths, and its speeds.

    python benchmarks/gpu/check_engine.py MODEL_DIR [--out check.json]

One FastModel, two kernel paths (``--kernels torch|triton``, switched with ``FastModel.set_kernels``;
each GraphDecoder keeps the kernels it captured). Checks (bf16):

* torch: prefill logits vs transformers' forward; teacher-forced decode steps replayed from CUDA
  graphs vs the prefill of the same tokens (max |d logprob|, top-1 agreement) and vs eager decode
  (graphs must not change a bit);
* triton: prefill vs torch prefill; graph decode vs the torch prefill and vs torch graph decode
  (batch 1 over 32 steps, and a batch of 4 at different positions); triton graph vs triton eager.

Times (CUDA events, median): decode step per batch size 1/4/16 at position 700 (torch graph, torch
eager, triton graph), batch 1 at position 4000 (split-KV's long-context case), a 4096-token prefill
per SDPA backend (torch) and with triton (SDPA auto), and transformers' own single-stream decode.
Prints a torch-vs-triton table last; ``--out`` writes every number as JSON.

``--small --device cpu`` runs the same script at toy sizes on a small model (with TRITON_INTERPRET=1
for the triton path; CPU "graphs" are eager), a smoke test of the script itself, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from hfserve.fast import FastModel, GraphDecoder  # noqa: E402

# Sizes: the 7B run, and --small (a smoke test of this script on a tiny model).
FULL = {"ids": 600, "steps": (500, 532), "pos4": [500, 517, 533, 560], "pos": 700, "far": 4000, "long": 4096,
        "capacity": 4608, "tpot_prompt": 512}
SMALL = {"ids": 80, "steps": (60, 64), "pos4": [60, 61, 70, 75], "pos": 70, "far": 280, "long": 128,
         "capacity": 300, "tpot_prompt": 40}


def cuda_time(fn, reps: int = 20) -> float:
    if not torch.cuda.is_available():  # --small on the CPU: wall time, once
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        t.append(a.elapsed_time(b))
    return sorted(t)[len(t) // 2]


def dlp(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |d logprob|, top-1 agreement) between two logit tensors (last dim the vocabulary)."""
    la, lb = torch.log_softmax(a.float(), -1), torch.log_softmax(b.float(), -1)
    return float((la - lb).abs().max()), float((la.argmax(-1) == lb.argmax(-1)).float().mean())


def table(res: dict) -> str:
    rows = [("decode b1 graph ms (pos 700)", "decode_ms_b1_graph", "decode_ms_b1_graph_triton"),
            ("decode b4 graph ms", "decode_ms_b4_graph", "decode_ms_b4_graph_triton"),
            ("decode b16 graph ms", "decode_ms_b16_graph", "decode_ms_b16_graph_triton"),
            ("decode b1 graph ms (pos 4000)", "decode_ms_b1_pos4000_graph", "decode_ms_b1_pos4000_graph_triton"),
            ("prefill 4096 ms (sdpa auto)", "prefill4096_ms_auto", "prefill4096_ms_auto_triton"),
            ("graph capture s", "graph_capture_s", "graph_capture_s_triton")]
    out = [f"{'':32s} {'torch':>9s} {'triton':>9s} {'triton/torch':>12s}"]
    for name, a, b in rows:
        x, y = res.get(a), res.get(b)
        if isinstance(x, float) and isinstance(y, float):
            out.append(f"{name:32s} {x:9.3f} {y:9.3f} {y / x:12.3f}")
    out.append(f"{'decode b1/b4/b16 eager ms (torch)':32s} "
               + " / ".join(f"{res.get(f'decode_ms_b{b}_eager', float('nan')):.2f}" for b in (1, 4, 16)))
    for k in ("prefill_max_abs_dlogprob_top1", "decode_vs_prefill_max_abs_dlogprob", "graph_equals_eager",
              "triton_prefill_vs_torch_max_abs_dlogprob", "triton_decode_vs_prefill_max_abs_dlogprob",
              "triton_decode_vs_torch_decode_max_abs_dlogprob", "triton_decode_vs_torch_decode_top1_agree",
              "triton_b4_vs_torch_b4_max_abs_dlogprob", "triton_graph_equals_eager"):
        out.append(f"{k:48s} {res.get(k)}")
    return "\n".join(out)


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="toy sizes: a smoke test of this script")
    args = ap.parse_args(argv)
    Z = SMALL if args.small else FULL
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    res: dict = {"torch": torch.__version__,
                 "device": torch.cuda.get_device_name() if dev.startswith("cuda") else dev}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    kw = {"device_map": dev} if dev != "cpu" else {}
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, **kw).eval()
    g = torch.Generator().manual_seed(0)
    vocab = min(30000, hf.config.vocab_size)
    ids = torch.randint(4, vocab, (Z["ids"],), generator=g).to(dev)
    want = torch.log_softmax(hf(ids[None]).logits[0].float(), -1)
    # transformers' own decode speed (dynamic cache, batch 1) before its weights are taken over.
    out = hf.generate(ids[None, :Z["tpot_prompt"]], max_new_tokens=8, do_sample=False, min_new_tokens=8)
    sync()
    t0 = time.perf_counter()
    hf.generate(ids[None, :Z["tpot_prompt"]], max_new_tokens=33, do_sample=False, min_new_tokens=33)
    sync()
    t1 = time.perf_counter()
    hf.generate(ids[None, :Z["tpot_prompt"]], max_new_tokens=1, do_sample=False)
    sync()
    res["hf_generate_tpot_ms"] = ((t1 - t0) - (time.perf_counter() - t1)) / 32 * 1000
    del out
    fm = FastModel(hf, slots=18, capacity=Z["capacity"])
    del hf
    got = torch.log_softmax(fm.prefill(ids, 0, 0, all_logits=True), -1)
    res["prefill_max_abs_dlogprob_top1"] = float((got.amax(-1) - want.amax(-1)).abs().max())
    res["prefill_top1_agree"] = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    fm.set_kernels("triton")
    got_x = fm.prefill(ids, 0, 0, all_logits=True)
    res["triton_prefill_vs_torch_max_abs_dlogprob"], res["triton_prefill_vs_torch_top1_agree"] = dlp(got_x, got)
    res["triton_prefill_vs_hf_max_abs_dlogprob"], res["triton_prefill_vs_hf_top1_agree"] = dlp(got_x, want)
    # Graph decoders: torch (graphs and eager), triton (graphs); each keeps the kernels it captured.
    fm.set_kernels("torch")
    dec_g = GraphDecoder(fm, 16, use_graphs=True)
    dec_e = GraphDecoder(fm, 16, use_graphs=False)
    res["graph_capture_s"] = dec_g.capture_all()
    fm.set_kernels("triton")
    dec_x = GraphDecoder(fm, 16, use_graphs=True)
    res["graph_capture_s_triton"] = dec_x.capture_all()
    fm.set_kernels("torch")  # prefill (the reference) and eager decode in torch unless switched

    def step(dec: GraphDecoder, j: int, kernels: str = "torch") -> torch.Tensor:
        fm.set_kernels("torch")
        fm.prefill(ids[:j], 0, 0)  # the same cache before every step
        fm.set_kernels(kernels)
        lg, _ = dec.step([int(ids[j])], [j])
        fm.set_kernels("torch")
        return lg[0].clone()

    worst, agree, bitwise = 0.0, 0, True
    xw, xa, xtw, xta, xbit = 0.0, 0, 0.0, 0, True
    lo, hi = Z["steps"]
    for j in range(lo, hi):
        lg, le, lx = step(dec_g, j), step(dec_e, j), step(dec_x, j, "triton")
        bitwise &= bool(torch.equal(lg, le))
        lp, lpx = torch.log_softmax(lg, -1), torch.log_softmax(lx, -1)
        worst = max(worst, float((lp - got[j]).abs().max()))
        agree += int(lp.argmax() == got[j].argmax())
        xw = max(xw, float((lpx - got[j]).abs().max()))
        xa += int(lpx.argmax() == got[j].argmax())
        xtw = max(xtw, float((lpx - lp).abs().max()))
        xta += int(lpx.argmax() == lp.argmax())
        if j < lo + 4:  # triton replayed vs triton eager (slow eagerly: a few steps)
            xbit &= bool(torch.equal(lx, step(dec_e, j, "triton")))
    res["decode_vs_prefill_max_abs_dlogprob"] = worst
    res["decode_vs_prefill_top1_agree"] = agree / (hi - lo)
    res["graph_equals_eager"] = bitwise
    res["triton_decode_vs_prefill_max_abs_dlogprob"] = xw
    res["triton_decode_vs_prefill_top1_agree"] = xa / (hi - lo)
    res["triton_decode_vs_torch_decode_max_abs_dlogprob"] = xtw
    res["triton_decode_vs_torch_decode_top1_agree"] = xta / (hi - lo)
    res["triton_graph_equals_eager"] = xbit
    # A batch of 4 at different positions (split-KV with 2 splits per row at this bucket).
    pos4 = Z["pos4"]

    def batch4(dec: GraphDecoder, kernels: str) -> torch.Tensor:
        fm.set_kernels("torch")
        for s, p in enumerate(pos4):
            fm.prefill(ids[:p], s, 0)
        fm.set_kernels(kernels)
        lg, _ = dec.step([int(ids[p]) for p in pos4], pos4)
        fm.set_kernels("torch")
        return lg[:4].clone()

    res["triton_b4_vs_torch_b4_max_abs_dlogprob"], res["triton_b4_vs_torch_b4_top1_agree"] = dlp(
        batch4(dec_x, "triton"), batch4(dec_g, "torch"))

    def timed(dec: GraphDecoder, kernels: str, b: int, p: int, reps: int = 20) -> float:
        fm.set_kernels(kernels)  # what eager steps run; a graph replays what it captured
        try:
            return cuda_time(lambda: dec.step([5] * b, [p] * b), reps=reps)
        finally:
            fm.set_kernels("torch")

    for b in (1, 4, 16):
        res[f"decode_ms_b{b}_graph"] = timed(dec_g, "torch", b, Z["pos"])
        res[f"decode_ms_b{b}_graph_triton"] = timed(dec_x, "triton", b, Z["pos"])
        res[f"decode_ms_b{b}_eager"] = timed(dec_e, "torch", b, Z["pos"], reps=5)
    res["decode_ms_b1_pos4000_graph"] = timed(dec_g, "torch", 1, Z["far"])
    res["decode_ms_b1_pos4000_graph_triton"] = timed(dec_x, "triton", 1, Z["far"])
    long = torch.randint(4, vocab, (Z["long"],), generator=g).to(dev)
    for be in ("auto", "flash", "efficient", "math"):
        fm.sdpa = be
        try:
            res[f"prefill4096_ms_{be}"] = cuda_time(lambda: fm.prefill(long, 1, 0), reps=5)
        except RuntimeError as exc:
            res[f"prefill4096_ms_{be}"] = f"error: {exc}"[:200]
    fm.sdpa = "auto"
    fm.set_kernels("triton")
    res["prefill4096_ms_auto_triton"] = cuda_time(lambda: fm.prefill(long, 1, 0), reps=5)
    fm.set_kernels("torch")
    print(json.dumps(res, indent=2))
    print(table(res), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
