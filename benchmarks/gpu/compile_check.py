"""Compile the fused decode GEMV (kernels._norm_gemv2_kernel) for the H200 ahead of time, on any machine.

    python benchmarks/gpu/compile_check.py [--arch 90] [--json out.json]

No GPU needed: Triton's NVIDIA backend and its bundled ptxas turn the kernel into a cubin for
``sm_<arch>`` (90 = H100/H200), for both epilogues (SwiGLU, RoPE + KV store), with and without the
residual delta, in every autotune config, with the 7B's constexprs (head_dim 128, 32 q / 8 kv heads),
and reads back each cubin's registers, local-memory spills and shared memory. It fails (exit 1) if a
config does not compile, spills, or needs more shared memory than an H200 SM has (227 KB), so a
kernel that the CPU interpreter runs but the GPU compiler rejects is caught before GPU time is spent.
It also reports whether the weight loads are pipelined (``cp.async`` in the PTX).

    python benchmarks/gpu/compile_check.py --mv [--arch 90] [--json out.json]

``--mv`` instead compiles ``--kernels triton-mv``'s GEMV (kernels._gemv_kernel) at each 7B shape of
kernels.MV_CONFIGS in its config, and MV_DEFAULT at an odd shape (N 1000, K 1000: the masked path), at
M=1 as mv_linear launches it, through the JIT's own warm-up path (gemv_bench's ahead-of-time
compile: the same specialisation as a launch), with the same checks (spills, shared memory, cp.async
where STAGES > 1).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not the interpreter's

SMEM_MAX = 227 * 1024
PTRS = {"X": "*bf16", "D": "*bf16", "LNW": "*bf16", "R": "*bf16", "W": "*bf16", "OUT": "*bf16", "COS": "*bf16",
        "SIN": "*bf16", "POS": "*i64", "KL": "*bf16", "VL": "*bf16"}
ALIGNED = ("K", "N2", "s_x", "s_d", "s_r", "s_o", "s_oh", "s_cos", "s_kb", "s_kh", "s_kp")  # multiples of 16 here


def compile_all(arch: int = 90) -> list[dict]:
    import triton
    from hfserve import hfkernels as kernels
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernels._norm_gemv2_kernel
    names = fn.arg_names
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    out = []
    for epi in (1, 2):
        for delta in (True, False):
            for cfg in kernels._GEMV_CONFIGS:
                consts = {"HALF": 64 if epi == 2 else 1, "NH": 32 if epi == 2 else 0, "NKV": 8 if epi == 2 else 0,
                          "HAS_DELTA": delta, "EPI": epi, "F32": False, "BLOCK_M": kernels.GEMV_MAX_ROWS, **cfg.kwargs}
                sig = {n: PTRS.get(n, "fp32" if n == "eps" else "constexpr" if n in consts else "i32") for n in names}
                src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                                attrs={(names.index(n),): [["tt.divisibility", 16]] for n in names
                                       if n in PTRS or n in ALIGNED})
                rec = {"epi": epi, "delta": delta, **cfg.kwargs, "num_warps": cfg.num_warps,
                       "num_stages": cfg.num_stages}
                try:
                    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                        options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
                except Exception as exc:  # the point of the script: say which config and why
                    rec["error"] = repr(exc)[:400]
                    out.append(rec)
                    continue
                rec["shared"] = ck.metadata.shared
                rec["cp_async"] = ck.asm["ptx"].count("cp.async.cg") + ck.asm["ptx"].count("cp.async.ca")
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(ck.asm["cubin"])
                    f.flush()
                    res = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
                m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
                if m:
                    rec["regs"], rec["stack"], rec["local"] = (int(g) for g in m.groups())
                out.append(rec)
    return out


def problems(recs: list[dict]) -> list[str]:
    bad = []
    for r in recs:
        tag = f"epi {r['epi']} delta {r['delta']} {r['BLOCK_N']}x{r['BLOCK_K']} w{r['num_warps']} s{r['num_stages']}"
        if "error" in r:
            bad.append(f"{tag}: {r['error']}")
        elif r.get("local") or r.get("stack"):
            bad.append(f"{tag}: spills ({r.get('local')} B local, {r.get('stack')} B stack)")
        elif r["shared"] > SMEM_MAX:
            bad.append(f"{tag}: {r['shared']} B of shared memory")
        elif not r["cp_async"]:
            bad.append(f"{tag}: weight loads not pipelined (no cp.async)")
    return bad


MV_ODD_SHAPE = (1000, 1000)  # where MV_DEFAULT runs masked (N and K not whole tiles)
TABLES_GPU = "NVIDIA H200"  # whose launch tables (hfserve/tables/) are compiled for sm_90


def compile_mv(arch: int = 90) -> list[dict]:
    """Every (shape, config) of kernels.MV_CONFIGS and MV_DEFAULT at MV_ODD_SHAPE, compiled for sm_<arch>
    by gemv_bench's ``_compile_job`` (the JIT's warm-up path, as a launch at M=1 specialises it)."""
    import gemv_bench
    from hfserve import hfkernels as kernels

    kernels.load_tables(TABLES_GPU)
    out = []
    for (n, k), c in [*kernels.MV_CONFIGS.items(), (MV_ODD_SHAPE, kernels.MV_DEFAULT)]:
        cfg = gemv_bench.Cfg(c.block_n, c.block_k, c.warps, c.stages, 1, c.reduce_each, c.evict)
        rec = gemv_bench._compile_job(gemv_bench.variant(cfg, 1) + (1,), n, k, arch, True)
        rec.update(N=n, K=k, cfg=c.label())
        out.append(rec)
    return out


# Memory instructions a kernel launched with launch_pdl must not issue before griddepcontrol.wait (the kernel
# before it may still be writing what they read, or reading what they write); prefetch.global.L2 of the weights is
# the one exception (no kernel of the decode step writes them).
_MEM_OP = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|st\.global|cp\.async|atom\.|red\.|cp\.reduce|st\.async|"
                     r"ld\.volatile\.global|ld\.relaxed|multimem)")


def pdl_order(ptx: str) -> dict:
    """Where a compiled kernel's PTX waits: ``wait`` / ``dependents`` (griddepcontrol.wait / .launch_dependents
    present), ``before_wait`` (global loads, stores, async copies or atomics before the first wait: a race under
    programmatic dependent launch), ``prefetch`` (prefetch.global.L2 before the wait)."""
    lines = ptx.splitlines()
    wait = next((i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln), None)
    head = lines if wait is None else lines[:wait]
    return {"wait": wait is not None, "dependents": any("griddepcontrol.launch_dependents" in ln for ln in lines),
            "before_wait": sum(bool(_MEM_OP.match(ln)) for ln in head),
            "prefetch": sum("prefetch.global.L2" in ln for ln in head)}


def compile_pdl(arch: int = 90) -> list[dict]:
    """Every kernel ``--pdl on`` launches with programmatic dependent launch, compiled for sm_<arch> through the JIT's
    warm-up path (gemv_bench's ``_AOTDriver``) with PDL and launch_pdl as the engine launches them, at the 7B's shapes
    in the launch tables' configs (64 rows; the GEMV at one row): the norm, SwiGLU, RoPE + KV store, decode
    attention (unsplit, split, the reduction; lowp), split-K's reduction, the GEMV and the skinny GEMM (plain, NORM,
    GLU with NORM, RES). Each record: :func:`pdl_order` of its PTX and the compiled launch_pdl flag."""
    import gemv_bench
    from triton.runtime.driver import driver

    K = gemv_bench.kernels
    K.load_tables(TABLES_GPU)
    driver.set_active(gemv_bench._AOTDriver(arch))
    bf, f32, i64 = torch.bfloat16, torch.float32, torch.int64
    nh, nkv, hd, ctx, d = 32, 8, 128, 1024, 4096
    pdl = dict(PDL=True, launch_pdl=True, grid=(1,))
    s_kb, s_kh = nkv * ctx * hd, ctx * hd
    attn = dict(G=nh // nkv, HD=hd, BLOCK_G=16, BLOCK_D=hd, BLOCK_N=32, PREC="tf32", LOWP=1, num_warps=2, num_stages=3)
    jobs: list[tuple[str, Callable]] = [
        ("rmsnorm", lambda: K._rmsnorm_kernel.warmup(bf, bf, bf, bf, bf, d, d, d, d, d, 1e-5, HAS_DELTA=True,
                                                      BLOCK=d, num_warps=4, **pdl)),
        ("silu_mul", lambda: K._silu_mul_kernel.warmup(bf, bf, 28672, 14336, 14336, BLOCK=1024, num_warps=4, **pdl)),
        ("rope_store", lambda: K._rope_store_kernel.warmup(bf, bf, bf, i64, i64, bf, bf, bf, (nh + 2 * nkv) * hd, hd,
                                                           nh * hd, hd, s_kb, s_kh, hd, NH=nh, NKV=nkv, HD=hd,
                                                           BLOCK_D=hd, HAS_SLOT=False, num_warps=1, **pdl)),
        ("decode_attn", lambda: K._decode_attn_kernel.warmup(bf, bf, bf, i64, bf, ctx, 0.1, nh * hd, hd, s_kb, s_kh,
                                                             hd, nh * hd, **attn, **pdl)),
        ("decode_attn_split", lambda: K._decode_attn_split_kernel.warmup(bf, bf, bf, i64, f32, f32, f32, ctx, 2, 512,
                                                                         0.1, nh * hd, hd, s_kb, s_kh, hd, NH=nh,
                                                                         **attn, **pdl)),
        ("attn_reduce", lambda: K._attn_reduce_kernel.warmup(f32, f32, f32, bf, nh * hd, 2, NH=nh, HD=hd, BLOCK_S=8,
                                                             BLOCK_D=hd, num_warps=1, **pdl)),
        ("splitk_reduce", lambda: K._splitk_reduce_kernel.warmup(f32, bf, d, 2, 64 * d, d, d, BLOCK=K.MM_RED_BLOCK,
                                                                 RES=True, num_warps=4, **pdl)),
    ]
    for (n, k), c in sorted(K.MV_CONFIGS.items()):
        jobs.append((f"gemv {n}x{k}", lambda n=n, k=k, c=c: K._gemv_kernel.warmup(
            bf, bf, bf, 1, n, k, 4, k, k, 0, n, BLOCK_M=1, BLOCK_N=c.block_n, BLOCK_K=c.block_k, EVEN_N=True,
            EVEN_K=True, REDUCE_EACH=c.reduce_each, EVICT=c.evict, STAGES=c.stages, num_warps=c.warps,
            num_stages=c.stages, **K.pdl_prefetch_kw(c.block_k, 2), **pdl)))
    def fused(kind: str, n: int, k: int) -> Any:
        """The table's 64-row launch for a fused kind where a sweep listed it (only winners are), else one of the
        sweep's space: every fused variant the engine can launch is compiled either way."""
        return K.MM_FUSE_CONFIGS.get((kind, 64, n, k)) or K.MmCfg(64, 128, 4, 4, 1, True, "evict_first")

    mm = [("mm qkv", fused("norm", 6144, 4096), 6144, 4096, {}),
          ("mm qkv NORM", fused("norm", 6144, 4096), 6144, 4096, {"NORM": True}),
          ("mm gate_up GLU NORM", fused("glu_norm", 28672, 4096), 14336, 4096, {"GLU": True, "NORM": True}),
          ("mm o RES", fused("res", 4096, 4096), 4096, 4096, {"RES": True}),
          ("mm down split", K.MM_CONFIGS[64, 4096, 14336], 4096, 14336, {})]
    for name, c, n, k, fuse in mm:
        part = c.split_k > 1
        jobs.append((name, lambda c=c, n=n, k=k, fuse=fuse, part=part: K._mm_kernel.warmup(
            bf, bf, f32 if part else bf, 64, n, k, 4, k, k, 64 * n if part else 0, n, n if fuse.get("GLU") else 0,
            bf, bf, n, 1e-5, BLOCK_M=64, BLOCK_N=c.block_n, BLOCK_K=c.block_k, EVEN_N=True, EVEN_K=True, SWAP=c.swap,
            EVICT=c.evict, STAGES=c.stages, F32=False, num_warps=c.warps, num_stages=c.stages,
            **K.pdl_prefetch_kw(c.block_k, 2), **fuse, **pdl)))
    out = []
    for name, job in jobs:
        rec: dict = {"kernel": name}
        try:
            ck = job()
        except Exception as exc:  # the point of the check: say which kernel and why
            rec["error"] = repr(exc)[:400]
        else:
            rec.update(pdl_order(ck.asm["ptx"]), launch_pdl=bool(getattr(ck.metadata, "launch_pdl", False)))
        out.append(rec)
    return out


def pdl_problems(recs: list[dict]) -> list[str]:
    """What would make --pdl on unsafe or pointless: a compile error, a kernel that does not wait, or touches memory
    before its wait, or is not compiled for a programmatic launch; a GEMM or GEMV that prefetches nothing."""
    bad = []
    for r in recs:
        tag = r["kernel"]
        if "error" in r:
            bad.append(f"{tag}: {r['error']}")
        elif not (r["wait"] and r["dependents"] and r["launch_pdl"]):
            bad.append(f"{tag}: wait {r['wait']}, launch_dependents {r['dependents']}, launch_pdl {r['launch_pdl']}")
        elif r["before_wait"]:
            bad.append(f"{tag}: {r['before_wait']} memory instruction(s) before griddepcontrol.wait")
        elif tag.startswith(("mm", "gemv")) and not r["prefetch"]:
            bad.append(f"{tag}: no weight prefetch before the wait")
    return bad


def _report(recs: list[dict], bad: list[str], summary: str, json_path: str) -> int:
    """Print each record and each problem, write the records to ``json_path`` (if given), print ``summary``;
    the exit status: 1 on any problem."""
    for r in recs:
        print(json.dumps(r))
    if json_path:
        Path(json_path).write_text(json.dumps(recs, indent=2) + "\n")
    for b in bad:
        print("PROBLEM", b)
    print(summary)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json", default="")
    ap.add_argument("--mv", action="store_true", help="the triton-mv GEMV's configs instead (kernels.MV_CONFIGS)")
    ap.add_argument("--pdl", action="store_true",
                    help="the kernels --pdl on launches with programmatic dependent launch: each waits before it "
                         "touches memory (compile_pdl)")
    args = ap.parse_args(argv)
    if args.pdl:
        recs = compile_pdl(args.arch)
        bad = pdl_problems(recs)
        return _report(recs, bad, f"{len(recs) - len(bad)} of {len(recs)} --pdl kernels wait before they touch memory "
                       f"(sm_{args.arch})", args.json)
    if args.mv:
        import gemv_bench  # compile_mv put it on the path

        recs = compile_mv(args.arch)
        bad = gemv_bench.aot_problems(recs)
        return _report(recs, bad, f"{len(recs) - len(bad)} of {len(recs)} triton-mv configs compile for "
                       f"sm_{args.arch} cleanly", args.json)
    recs = compile_all(args.arch)
    bad = problems(recs)
    return _report(recs, bad, f"{len(recs) - len(bad)} of {len(recs)} configs compile for sm_{args.arch} cleanly",
                   args.json)

if __name__ == "__main__":
    sys.exit(main())
