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
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not the interpreter's
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hfserve"))

SMEM_MAX = 227 * 1024
PTRS = {"X": "*bf16", "D": "*bf16", "LNW": "*bf16", "R": "*bf16", "W": "*bf16", "OUT": "*bf16", "COS": "*bf16",
        "SIN": "*bf16", "POS": "*i64", "KL": "*bf16", "VL": "*bf16"}
ALIGNED = ("K", "N2", "s_x", "s_d", "s_r", "s_o", "s_oh", "s_cos", "s_kb", "s_kh", "s_kp")  # multiples of 16 here


def compile_all(arch: int = 90) -> list[dict]:
    import hfkernels as kernels
    import triton
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


def compile_mv(arch: int = 90) -> list[dict]:
    """Every (shape, config) of kernels.MV_CONFIGS and MV_DEFAULT at MV_ODD_SHAPE, compiled for sm_<arch>
    by gemv_bench's ``_compile_job`` (the JIT's warm-up path, as a launch at M=1 specialises it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gemv_bench
    import hfkernels as kernels

    out = []
    for (n, k), c in [*kernels.MV_CONFIGS.items(), (MV_ODD_SHAPE, kernels.MV_DEFAULT)]:
        cfg = gemv_bench.Cfg(c.block_n, c.block_k, c.warps, c.stages, 1, c.reduce_each, c.evict)
        rec = gemv_bench._compile_job(gemv_bench.variant(cfg, 1) + (1,), n, k, arch, True)
        rec.update(N=n, K=k, cfg=c.label())
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json", default="")
    ap.add_argument("--mv", action="store_true", help="the triton-mv GEMV's configs instead (kernels.MV_CONFIGS)")
    args = ap.parse_args(argv)
    if args.mv:
        import gemv_bench  # compile_mv put it on the path

        recs = compile_mv(args.arch)
        for r in recs:
            print(json.dumps(r))
        if args.json:
            Path(args.json).write_text(json.dumps(recs, indent=2) + "\n")
        bad = gemv_bench.aot_problems(recs)
        for b in bad:
            print("PROBLEM", b)
        print(f"{len(recs) - len(bad)} of {len(recs)} triton-mv configs compile for sm_{args.arch} cleanly")
        return 1 if bad else 0
    recs = compile_all(args.arch)
    for r in recs:
        print(json.dumps(r))
    if args.json:
        Path(args.json).write_text(json.dumps(recs, indent=2) + "\n")
    bad = problems(recs)
    for b in bad:
        print("PROBLEM", b)
    print(f"{len(recs) - len(bad)} of {len(recs)} configs compile for sm_{args.arch} cleanly")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
