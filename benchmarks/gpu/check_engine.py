"""On the GPU: the fast engine against transformers on the forged 7B model, and its raw speeds.

    python benchmarks/gpu/check_engine.py MODEL_DIR [--out check.json]

Checks (bf16): prefill logits vs transformers' forward; teacher-forced decode steps replayed from
CUDA graphs vs the prefill of the same tokens (max |d logprob|, top-1 agreement) and vs eager
decode (graphs must not change a bit). Times: decode step per batch size (graph vs eager), a
4096-token prefill per SDPA backend, and transformers' own single-stream decode for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hfserve"))
from fastengine import FastModel, GraphDecoder  # noqa: E402


def cuda_time(fn, reps: int = 20) -> float:
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


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    res: dict = {}
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map="cuda").eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 30000, (600,), generator=g).cuda()
    want = torch.log_softmax(hf(ids[None]).logits[0].float(), -1)
    # transformers' own decode speed (dynamic cache, batch 1) before its weights are taken over.
    out = hf.generate(ids[None, :512], max_new_tokens=8, do_sample=False, min_new_tokens=8)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    hf.generate(ids[None, :512], max_new_tokens=33, do_sample=False, min_new_tokens=33)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    hf.generate(ids[None, :512], max_new_tokens=1, do_sample=False)
    torch.cuda.synchronize()
    res["hf_generate_tpot_ms"] = ((t1 - t0) - (time.perf_counter() - t1)) / 32 * 1000
    del out
    fm = FastModel(hf, slots=18, capacity=4608)
    del hf
    got = torch.log_softmax(fm.prefill(ids, 0, 0, all_logits=True), -1)
    res["prefill_max_abs_dlogprob_top1"] = float((got.amax(-1) - want.amax(-1)).abs().max())
    res["prefill_top1_agree"] = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    # Teacher-forced decode from a 500-token prefill, graphs vs eager vs prefill logits.
    dec_g = GraphDecoder(fm, 16, use_graphs=True)
    dec_e = GraphDecoder(fm, 16, use_graphs=False)
    t0 = time.perf_counter()
    res["graph_capture_s"] = dec_g.capture_all()
    worst, agree, bitwise = 0.0, 0, True
    for j in range(500, 532):
        fm.prefill(ids[:j], 0, 0)
        lg, _ = dec_g.step([int(ids[j])], [j])
        lg = lg[0].clone()
        fm.prefill(ids[:j], 0, 0)
        le, _ = dec_e.step([int(ids[j])], [j])
        bitwise &= bool(torch.equal(lg, le[0]))
        lp = torch.log_softmax(lg, -1)
        worst = max(worst, float((lp - got[j]).abs().max()))
        agree += int(lp.argmax() == got[j].argmax())
    res["decode_vs_prefill_max_abs_dlogprob"] = worst
    res["decode_vs_prefill_top1_agree"] = agree / 32
    res["graph_equals_eager"] = bitwise
    for b in (1, 4, 16):
        toks, pos = [5] * b, [700] * b
        res[f"decode_ms_b{b}_graph"] = cuda_time(lambda t=toks, p=pos: dec_g.step(t, p))
        res[f"decode_ms_b{b}_eager"] = cuda_time(lambda t=toks, p=pos: dec_e.step(t, p), reps=5)
    long = torch.randint(4, 30000, (4096,), generator=g).cuda()
    for be in ("auto", "flash", "efficient", "math"):
        fm.sdpa = be
        try:
            res[f"prefill4096_ms_{be}"] = cuda_time(lambda: fm.prefill(long, 1, 0), reps=5)
        except RuntimeError as exc:
            res[f"prefill4096_ms_{be}"] = f"error: {exc}"[:200]
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
