"""Where the time goes per engine step: the profile table and the %-of-floor plot (no GPU needed).

    python benchmarks/gpu/step_table.py profile_steps.json [more.json ...] [--md steps.md] [--plot steps.svg]

``profile_best.py --steps`` measures, for each engine step of engine_steps.json, the steps that
make up scenarios A-C (a 4096-token prefill, a decode step at batch 1, C's burst prefill and its
decode step at the burst's batch) with torch.profiler, and writes them as JSON; this module turns
that JSON into a markdown table (GEMM / fused / attention / other / between kernels, per part and
step) and a plot of each scenario's % of its speed-of-light floor per step (SVG or PNG by suffix).

Kinds of kernel: ``gemm`` (cuBLAS / CUTLASS matmuls), ``fused`` (hfserve.hfkernels' Triton norms, RoPE +
store and SwiGLU), ``attention`` (SDPA's flash / memory-efficient kernels, softmax, hfserve.hfkernels'
decode attention and its split reduction), ``other`` (the unfused norms, RoPE, elementwise work and
copies), and ``between``: the part's wall time minus the sum of its kernels (launch gaps and host
work; for a CUDA-graph decode step, the replay's wall time).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "classify", "split", "c_time_ms", "frac_of_floor", "markdown_table", "write_plot", "merge",
           "step_numbers", "select"]

KINDS = ("gemm", "fused", "attention", "other", "between")
_ATTN = ("flash", "fmha", "attention", "softmax", "_decode_attn", "_attn_reduce", "attn_span")
_FUSED = ("_rmsnorm_kernel", "_silu_mul_kernel", "_rope_store_kernel")
# _norm_gemv2_kernel (--kernels triton-gemv) is a GEMV with the norm, RoPE + store or SwiGLU fused in: GEMM.
_GEMM = ("gemm", "xmma", "cutlass", "nvjet", "matmul", "sm90_", "cublas", "_norm_gemv2")
PARTS = ("A prefill 4096", "B decode b1", "C prefill burst", "C decode")


def classify(name: str) -> str:
    """The kind of one CUDA kernel, from its name."""
    n = name.lower()
    if any(k in n for k in _ATTN):
        return "attention"
    if any(k.lower() in n for k in _FUSED):
        return "fused"
    if any(k in n for k in _GEMM):
        return "gemm"
    return "other"


def split(kernels_ms: dict[str, float], wall_ms: float) -> dict[str, float]:
    """Kernel time by name -> by kind, plus ``between`` (wall minus all kernels, never below 0)."""
    out = dict.fromkeys(KINDS, 0.0)
    for name, ms in kernels_ms.items():
        out[classify(name)] += ms
    out["between"] = max(0.0, wall_ms - sum(out[k] for k in KINDS if k != "between"))
    return {k: round(v, 3) for k, v in out.items()}


def c_time_ms(parts: dict[str, Any], burst: int, out_tokens: int, batch: int) -> float:
    """C's burst modelled from its profiled parts: ceil(burst / batch) waves, each one wave's prefill
    then ``out_tokens`` decode steps at the wave's batch (no HTTP, no overlap of waves)."""
    waves = math.ceil(burst / max(1, batch))
    return waves * (parts["C prefill burst"]["wall_ms"] + out_tokens * parts["C decode"]["wall_ms"])


def frac_of_floor(parts: dict[str, Any], floors: dict[str, float], *, burst: int = 64, out_tokens: int = 128,
                  batch: int = 64) -> dict[str, float | None]:
    """Each scenario's floor over its profiled (A, B) or modelled (C) time: 1.0 = at the speed of light."""
    a, b = parts.get("A prefill 4096"), parts.get("B decode b1")
    res: dict[str, float | None] = {
        "A": floors["prefill_ttft_ms"] / a["wall_ms"] if a else None,
        "B": floors["decode_tpot_ms"] / b["wall_ms"] if b else None,
        "C": None,
    }
    if "C prefill burst" in parts and "C decode" in parts:
        tok_s = burst * out_tokens / (c_time_ms(parts, burst, out_tokens, batch) / 1000)
        res["C"] = tok_s / floors["throughput_tok_s"]
    return res


def _step_fracs(doc: dict[str, Any], step: dict[str, Any]) -> dict[str, float | None]:
    c = doc.get("c_shape", {})
    return frac_of_floor(step["parts"], doc["floors"], burst=c.get("burst", 64), out_tokens=c.get("output_tokens", 128),
                         batch=step.get("batch", 64))


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per (engine step, part): wall ms, the five kinds in ms, and the scenario's % of floor."""
    head = "| step | part | wall ms | GEMM | fused | attention | other | between | % of floor |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for step in doc["steps"]:
        fr = _step_fracs(doc, step)
        for part in PARTS:
            p = step["parts"].get(part)
            if p is None:
                continue
            kinds = split(p["kernels_ms"], p["wall_ms"])
            scen = part[0]
            pct = fr.get(scen)
            shown = "" if pct is None or (part == "C prefill burst") else f"{100 * pct:.0f}%"
            if part == "C decode" and pct is not None:
                shown += " (C, modelled)"
            cells = " | ".join(f"{kinds[k]:.2f}" for k in KINDS)
            lines.append(f"| {step['step']} | {part} | {p['wall_ms']:.2f} | {cells} | {shown} |")
    return "\n".join(lines) + "\n"


def write_plot(doc: dict[str, Any], path: str | Path) -> Path:
    """% of floor per scenario (A, B, C) against the engine step, as SVG or PNG (by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s["step"] for s in doc["steps"]]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for scen, label in (("A", "A prefill 4096/128 (TTFT)"), ("B", "B decode 512/512 (TPOT)"),
                        ("C", "C burst 64 x 512/128 (tok/s, modelled)")):
        ys = [_step_fracs(doc, s)[scen] for s in doc["steps"]]
        xs = [x for x, y in zip(steps, ys, strict=True) if y is not None]
        ax.plot(xs, [100 * y for y in ys if y is not None], marker="o", label=label)
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("engine step (benchmarks/gpu/engine_steps.json)")
    ax.set_ylabel("% of speed-of-light floor")
    ax.set_xticks(steps)
    ax.set_ylim(0, 110)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(doc.get("title", "Where each engine step stands against the floor"), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def step_numbers(steps: list[dict[str, Any]]) -> list[int]:
    """engine_steps.json's entries' engine step numbers, from their rationale ("engine step N: ..."). Not their
    positions: steps 6 and 9 changed no knob and have no entry, so entry 6 is step 7 and entry 12 step 14.
    ValueError for an entry whose rationale does not start so."""
    out = []
    for i, s in enumerate(steps):
        m = re.match(r"engine step (\d+)", s.get("rationale", ""))
        if not m:
            raise ValueError(f"engine_steps.json entry {i + 1} does not start 'engine step N'")
        out.append(int(m.group(1)))
    return out


def select(steps: list[dict[str, Any]], only: str = "") -> tuple[list[int], list[dict[str, Any]]]:
    """The engine step numbers and entries to profile: all, or those of ``only`` ("5,7,8": engine step numbers).
    ValueError naming the steps that have an entry when ``only`` names one without (6, 9) or none at all."""
    numbers = step_numbers(steps)
    if not only.strip():
        return numbers, list(steps)
    by_no = dict(zip(numbers, steps, strict=True))
    try:
        want = [int(n) for n in only.split(",") if n.strip()]
    except ValueError as exc:
        raise ValueError(f"--only {only!r}: comma-separated engine step numbers, e.g. 5,7,8") from exc
    missing = [n for n in want if n not in by_no]
    if missing or not want:
        raise ValueError(f"--only {only!r}: no engine_steps.json entry for step(s) {missing or want} (steps 6 and 9 "
                         f"changed no knob); the entries are steps {', '.join(map(str, numbers))}")
    return want, [by_no[n] for n in want]


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several ``profile_best.py --steps`` JSONs of one GPU (a session's commands each profile some steps: --only) as
    one: the steps by number, a later file's step replacing an earlier's; model, floors and C's shape from the last.
    ValueError when they come from different GPUs (their floors and times do not share one table)."""
    gpus = {d.get("gpu") for d in docs}
    if len(gpus) > 1:
        raise ValueError(f"profiles from different GPUs ({', '.join(sorted(map(str, gpus)))}): one table per GPU")
    steps: dict[int, dict[str, Any]] = {}
    for d in docs:
        steps.update({s["step"]: s for s in d["steps"]})
    return {**docs[-1], "steps": [steps[k] for k in sorted(steps)]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="+", help="profile_best.py --steps JSON (several: merged by step, one GPU's)")
    ap.add_argument("--md", default="", help="write the markdown table here (default: print it)")
    ap.add_argument("--plot", default="", help="write the plot here (.svg or .png)")
    args = ap.parse_args(argv)
    try:
        doc = merge([json.loads(Path(p).read_text()) for p in args.profile])
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"step_table: {exc}") from None
    table = markdown_table(doc)
    if args.md:
        Path(args.md).write_text(table)
    print(table)
    if args.plot:
        print("plot:", write_plot(doc, args.plot))


if __name__ == "__main__":
    main()
