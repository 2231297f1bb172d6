"""Where the time goes in the best candidate: kernel time by kind for its prefill and decode steps.

    python benchmarks/gpu/profile_best.py MODEL_DIR --db infergoal.db [--out profile.json]
    python benchmarks/gpu/profile_best.py MODEL_DIR --steps benchmarks/gpu/engine_steps.json \
        --out profile_steps.json [--md steps.md] [--plot steps.svg] [--sol sol.json]

Takes the best kept trial's knobs from the database (dtype, SDPA backend, batch size), rebuilds
the fast engine's model, and with torch.profiler splits CUDA kernel time of (a) one 4096-token
prefill (scenario A) and (b) one decode step at batch 1 (B) and at the batch size (C) into GEMMs,
attention, and everything else; it also times the CUDA-graph replay of the same decode step, so
the gap between the graph's wall time and its kernel time is the launch/host overhead left.

With ``--steps`` it does that for every engine step of engine_steps.json instead, on one model
(the KV pool sized for the largest step; each step switches kernels, prefill attention, batch and
packing): per step (A) a 4096-token prefill, (B) a graph decode step at batch 1 at position 700,
(C) one wave of the burst's prefill (min(64, batch) prompts of 512, packed as the step packs them)
and a graph decode step at that batch at position 576; kernel time by name, wall time per part.
step_table.py writes the table (GEMM / fused / attention / other / between) and the %-of-floor plot.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from check_engine import cuda_time  # noqa: E402
from hfserve.fast import FastModel, GraphDecoder, set_pdl  # noqa: E402
from step_table import select, step_numbers  # noqa: E402


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
    if any(k in n for k in ("gemm", "xmma", "cutlass", "nvjet", "matmul", "sm90", "gemv")):
        return "gemm"
    return "other (norms, RoPE, elementwise, copies)"


def kernel_times(fn) -> dict[str, float]:
    """CUDA kernel time (ms) by kernel name over one call of ``fn`` (after one unprofiled call).
    Without a GPU: CPU self time by operator (how the CPU test runs this code)."""
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        fn()
        sync()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        if not gpu:
            out[ev.key] += ev.self_cpu_time_total / 1000
            continue
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            out[ev.key] += t / 1000
    return {k: round(v, 4) for k, v in out.items()}


def profile_steps(fm: FastModel, steps: list[dict], *, burst: int = 64, prompt: int = 512, long_len: int = 4096,
                  b_pos: int = 700, ctx: int = 1024, numbers: list[int] | None = None,
                  on_step: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """The four parts of every engine step (see the module docstring), each {wall_ms, kernels_ms}.
    The sizes are A's, B's and C's; the CPU test passes small ones. ``numbers``: the steps' numbers
    (default: from their rationales, step_table.step_numbers). A step that raises keeps the parts it measured and
    its error (``"error"``), and the next step still runs. ``on_step(done)`` after each step (main_steps
    writes the JSON then: a command cut at its time limit keeps the steps it profiled)."""
    out, ref, ref_dec = [], None, None
    dev, vocab = fm.device, fm.embed.shape[0]
    long = torch.randint(4, vocab, (long_len,), device=dev)
    prompts = [torch.randint(4, vocab, (prompt,), device=dev) for _ in range(burst)]
    numbers = numbers or step_numbers(steps)
    for i, step in zip(numbers, steps, strict=True):
        rec = {"step": i, "knobs": step["knobs"], "rationale": step.get("rationale", ""), "parts": {}}
        try:
            ref, ref_dec = _profile_step(fm, rec, step, ref, ref_dec, long, prompts, burst=burst, prompt=prompt,
                                         b_pos=b_pos, ctx=ctx)
        except Exception as exc:  # keep what it measured and say why (e.g. a kernel that does not compile)
            rec["error"] = repr(exc)[:800]
            print(f"step {i}: failed: {exc!r}"[:800], flush=True)
        out.append(rec)
        if on_step is not None:
            on_step(out)
    return out


def _profile_step(fm: FastModel, rec: dict, step: dict, ref, ref_dec, long, prompts, *, burst: int, prompt: int,
                  b_pos: int, ctx: int) -> tuple[Any, Any]:
    i = rec["step"]
    dev = fm.device
    k = step["knobs"]
    fm.set_kernels(k.get("kernels", "torch"))
    fm.set_prefill_attn(k.get("prefill_attn", "torch"))
    fm.set_decode_attn(k.get("decode_attn", "default"))
    fm.set_mm_glu(k.get("mm_glu") == "on")  # steps 11-13 (off before set_kernels could refuse them: set in order)
    fm.set_mm_norm(k.get("mm_norm") == "on")
    set_pdl(fm, k.get("pdl") == "on")
    batch = min(burst, int(k.get("max_batch_size", 8)) if k.get("batching") == "on" else 1)
    pack = int(k.get("prefill_pack", 0))
    wave = prompts[:batch]

    def burst_prefill(wave=wave, pack=pack) -> None:
        if not pack:
            for j, p in enumerate(wave):
                fm.prefill(p, j, 0)
            return
        group, used = [], 0
        for j, p in enumerate(wave):
            if group and used + len(p) > pack:
                fm.prefill_packed(group)
                group, used = [], 0
            group.append((p, j, 0))
            used += len(p)
        fm.prefill_packed(group)

    # Same answer as the first step: the 4096-token prompt's next-token logits (bf16 on the GPU).
    last = fm.prefill(long, 0, 0)[-1]
    ref = last if ref is None else ref
    check = {"max_abs_logit_diff_vs_first": round(float((last - ref).abs().max()), 4),
             "top1_same_as_first": bool(int(last.argmax()) == int(ref.argmax()))}
    parts: dict[str, dict] = rec["parts"]
    rec.update(batch=batch, prefill_check=check)
    parts["A prefill 4096"] = {"wall_ms": cuda_time(lambda: fm.prefill(long, 0, 0), reps=5),
                               "kernels_ms": kernel_times(lambda: fm.prefill(long, 0, 0))}
    parts["C prefill burst"] = {"wall_ms": cuda_time(burst_prefill, reps=3), "kernels_ms": kernel_times(burst_prefill)}
    for name, b, pos in (("B decode b1", 1, b_pos), ("C decode", batch, prompt + 64)):
        dec = GraphDecoder(fm, b, use_graphs=True)
        toks, poss = [7] * b, [pos] * b
        t = torch.tensor(toks, device=dev)
        ps = torch.tensor(poss, device=dev)
        parts[name] = {"wall_ms": cuda_time(lambda d=dec, a=toks, q=poss: d.step(a, q)),
                       "kernels_ms": kernel_times(lambda t=t, ps=ps, ctx=ctx: fm.decode(t, ps, ctx))}
        if name == "B decode b1":
            # The graph step's logits, and 16 greedy graph steps from there, against the first profiled
            # step's (same cache: every step prefills the same prompts first), so a decode path that
            # computes wrong shows here: the first logits' largest difference, and how many of the
            # 16 greedy tokens agree before the first that does not.
            lg, seq, tok = None, [], toks[0]
            for j in range(16):
                step_lg, ids = dec.step([tok], [pos + j])
                lg = step_lg[0].float().clone() if lg is None else lg
                tok = ids[0]
                seq.append(tok)
            ref_dec = (lg, seq) if ref_dec is None else ref_dec
            same = next((j for j, (a, b) in enumerate(zip(seq, ref_dec[1], strict=True)) if a != b), len(seq))
            rec["decode_check"] = {"max_abs_logit_diff_vs_first": round(float((lg - ref_dec[0]).abs().max()), 4),
                                   "top1_same_as_first": bool(int(lg.argmax()) == int(ref_dec[0].argmax())),
                                   "greedy16_same_as_first": same}
    print(f"step {i}: " + ", ".join(f"{n} {p['wall_ms']:.2f} ms" for n, p in parts.items())
          + f"; prefill {check}; decode {rec.get('decode_check')}", flush=True)
    return ref, ref_dec


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
    ap.add_argument("--steps", default="", help="engine_steps.json: profile every step instead of the best trial")
    ap.add_argument("--sol", default=str(Path(__file__).parent / "results" / "sol.json"))
    ap.add_argument("--scenarios", default=str(Path(__file__).parent / "scenarios_ib.toml"))
    ap.add_argument("--only", default="", help="with --steps: comma-separated engine step numbers (as engine_steps.json's "
                                               "rationales number them; 6 and 9 have no entry), e.g. 5,7,8")
    ap.add_argument("--md", default="", help="with --steps: the markdown table")
    ap.add_argument("--plot", default="", help="with --steps: the %%-of-floor plot (.svg or .png)")
    args = ap.parse_args(argv)
    if args.steps:
        return main_steps(args)
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


def main_steps(args: argparse.Namespace) -> None:
    import tomllib
    from headline import ib_floors
    from step_table import markdown_table, write_plot
    from transformers import AutoModelForCausalLM

    try:  # before the model loads: a wrong --only costs no GPU time
        numbers, steps = select(json.loads(Path(args.steps).read_text()), args.only)
    except ValueError as exc:
        raise SystemExit(f"profile_best: {exc}") from None
    slots = max(int(s["knobs"].get("max_batch_size", 8)) for s in steps) + 2
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map="cuda").eval()
    fm = FastModel(hf, slots=slots, capacity=4608)
    del hf
    floors = ib_floors(json.loads(Path(args.sol).read_text()), tomllib.loads(Path(args.scenarios).read_text()))
    doc = {"model": args.model, "gpu": torch.cuda.get_device_name(), "floors": floors,
           "c_shape": {"burst": 64, "prompt_tokens": 512, "output_tokens": 128}, "steps": []}

    def save(done: list[dict]) -> None:
        if args.out:
            Path(args.out).write_text(json.dumps({**doc, "steps": done}, indent=2) + "\n")

    doc["steps"] = profile_steps(fm, steps, numbers=numbers, on_step=save)
    table = markdown_table(doc)
    print(table)
    if args.md:
        Path(args.md).write_text(table)
    if args.plot:
        write_plot(doc, args.plot)


if __name__ == "__main__":
    main()
