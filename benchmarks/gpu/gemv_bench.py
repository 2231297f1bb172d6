"""Does any GEMV formulation beat cuBLAS at the 7B's decode shapes? cuBLAS vs a plain, widely tuned Triton GEMV.

    python benchmarks/gpu/gemv_bench.py [--out gemv.json] [--budget-s 90]     # on the H200 (one command)
    python benchmarks/gpu/gemv_bench.py --device cpu [--bug skip_k_tile]       # smoke: interpreter, tiny shapes
    python benchmarks/gpu/gemv_bench.py --compile-only [--arch 90] [--jobs N]  # ahead of time, any machine

y = x @ W.T in bf16, W [N, K] row-major as nn.Linear stores it, x [M, K], M in {1, 2, 4}, at the
Mistral-7B decode shapes (``SHAPES``: fused QKV, O, fused gate_up, down, lm_head), random weights
(no checkpoint). Contenders per (shape, M):

* cuBLAS through torch: ``F.linear(x, W)`` (what the engine calls: the baseline every ratio is against),
  ``torch.matmul(x, W.t())`` and, at M=1, ``torch.mv(W, x[0])``;
* ``gemv()``: a plain (unfused) Triton GEMV (``_gemv_kernel``, kept in hfserve.hfkernels,
  where ``--kernels triton-mv`` serves with it), one program per BLOCK_N rows of W and per K split. Each
  program streams [BLOCK_N, BLOCK_K] tiles of W along K (contiguous: 16-byte vector loads, the rows of a
  warp side by side), multiplies them in fp32 by the matching slice of each of the M rows of x (held in
  L2/L1), and accumulates either a [BLOCK_N, BLOCK_K] fp32 tile reduced once at the end (REDUCE_EACH
  off: no cross-thread work in the loop, more registers) or a [BLOCK_N] vector reduced per tile
  (REDUCE_EACH on). STAGES > 1 pipelines the W tiles through shared memory with cp.async
  (``tl.range(num_stages=...)``; a plain loop of loads is never pipelined by Triton 3.6), STAGES 1
  loads them straight into registers. EVICT "evict_first" marks the W loads streaming.
  Split-K: SPLIT_K programs per N block each write an fp32 partial [SPLIT_K, M, N]; a second tiny
  kernel sums the partials in a fixed order and rounds to bf16 (deterministic, no atomics, no zeroing
  memset: 2 launches, against the 3 an fp32 atomic_add would need: memset + GEMV + cast).

The tuning space (``space()``): BLOCK_N 8..128, BLOCK_K 64..1024, num_warps 2/4/8 with 8..64 W elements
per thread per tile, STAGES 1/2/3/4/6 (shared memory <= SMEM_BUDGET), REDUCE_EACH, EVICT, SPLIT_K 1/2/4/8
(K a multiple of SPLIT_K * BLOCK_K): ~300 configs per (shape, M) in stage 1, every (BLOCK_N, BLOCK_K,
warps, SPLIT_K) at STAGES 1 and 3; stage 2 the full STAGES x REDUCE_EACH x EVICT product around each
case's 2 best; the best 3 are timed again at full length, the fastest wins. ``--budget-s`` (90) bounds
the tuning: stage 1 ends at 55% of it, stage 2 at 85% (the configs timed per case are in the table).
Kernels are compiled ahead of the timing in ``--jobs`` processes through the JIT's own warm-up path
with the H200's target (``_AOTDriver``), into Triton's on-disk cache, so the timing process finds them
compiled (``pool`` in the JSON: compile seconds, and ``first_call_s``: ~ms per config on a cache hit).

Timing (H200): (a) ``graph``: CUDA graphs of 20 back-to-back calls replayed (no launch overhead, as
the engine's decode graph), median of ``--reps`` (25) replays, in tuning median of 3; (b) ``eager``:
each call alone (synchronised first), CUDA events around it: includes the launch's CPU time. L2 (50 MB)
never holds the weights: the 20 calls of a graph read 20 different copies (the 32 layers' weights of
the layer sequence below; lm_head has 2 copies of 262 MB). GB/s = N*K*2 bytes / time. Every timed
Triton config's output is checked against a float64 reference (max |y - ref| of the bf16 output,
tolerance max(2 x cuBLAS's own error, 2**-7 x max |ref|): ``check()``); failing configs are dropped
and counted.

GPU command (one ``nvidia-h200`` call, from the repository root; no model, no wheels: torch and triton
of the image; ~100 s: ~15 s of parallel compiles, ~75 s of tuning, ~10 s of finals)::

    PYTHONPATH=/tmp/site:$PWD timeout 170 python3 benchmarks/gpu/gemv_bench.py --out $OUT/gemv.json 2>&1 | tee $OUT/gemv.log

Layer sequence: QKV, O, gate_up, down at M=1 for all 32 layers (14 GB of weights) in one graph, as
the engine's decode step runs them: cuBLAS, the best Triton config per shape, and per shape whichever
of the two was faster; ``step_gain_ms`` adds lm_head's difference: what the decode step would gain.

Prediction (2026-12-03, before any GPU number of this script): cuBLAS already streams at ~3.75 TB/s,
~88% of the 4.27 TB/s copy ceiling (sol.json); a read-only stream has little more to give, so the best
Triton config lands at 0.95-1.03x cuBLAS's speed per shape at M=1: gate_up and lm_head (235/262 MB,
many programs, long streams) ~1.00 (0.98-1.03); down (K=14336, N=4096: few N blocks, split-K helps
Triton) ~0.98-1.02; QKV (50 MB) ~0.97-1.01; O (33.5 MB, ~9 us: ramp-up and tail are a large share)
0.93-1.00, split-K's second launch costing ~1-2 us there. At M=2 and M=4 cuBLAS leaves its GEMV
kernels for GEMM tiles, where Triton may win by 2-8%. Per layer at M=1: within +-3%, a decode-step
gain of -0.1 to +0.1 ms: not the 0.29 ms the issue needs, from GEMVs alone.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # before triton is imported: @triton.jit reads TRITON_INTERPRET when it runs
    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]:
        os.environ["TRITON_INTERPRET"] = "1"
    if "--compile-only" in sys.argv:
        os.environ.pop("TRITON_INTERPRET", None)

import argparse  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

LAYERS = 32
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (32000, 4096)}  # (N, K): Mistral-7B, 32 q / 8 kv heads of 128, intermediate 14336
LAYER_SHAPES = ("qkv", "o", "gate_up", "down")
# (N, K, Ms): "even" takes the GPU's unmasked path; "ragged" leaves N and K short of whole tiles (the
# masks) and M=3 a masked row of BLOCK_M 4.
SMOKE_SHAPES = {"even": (32, 256, (1, 4)), "ragged": (40, 320, (2, 3))}
MS = (1, 2, 4)
CALLS = 20  # calls per captured graph
RED_BLOCK = 1024  # split-K reduction: outputs per program
SMEM_BUDGET = 200 * 1024  # of the H200 SM's 227 KB, for the (STAGES - 1) buffered W tiles
SMEM_MAX = 227 * 1024
BUGS = ("", "skip_k_tile", "skip_n_block", "skip_split")
FIRST_CALL_S: list[float] = []  # per config, the first launch's seconds (~ms when the AOT cache hit)
INTERPRET = os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


# The kernels (``_gemv_kernel``, its split-K ``_splitk_reduce_kernel``) live in hfserve.hfkernels,
# where the engine's ``--kernels triton-mv`` launches them; this script tunes and times them. Under the
# interpreter they must be hfserve.hfkernels' interpreted ones: a kernels module imported earlier with compiled
# kernels (a test process) is reloaded in place with TRITON_INTERPRET set, as tests/hfserve/triton_interp does.
from hfserve import hfkernels as kernels  # noqa: E402

if INTERPRET:
    from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

    if not isinstance(kernels._gemv_kernel, InterpretedFunction):
        kernels = kernels.reloaded()
_gemv_kernel = kernels._gemv_kernel
_splitk_reduce_kernel = kernels._splitk_reduce_kernel


@dataclass(frozen=True, order=True)
class Cfg:
    block_n: int
    block_k: int
    warps: int
    stages: int
    split_k: int = 1
    reduce_each: bool = True
    evict: str = ""

    def label(self) -> str:
        return (f"n{self.block_n}k{self.block_k}w{self.warps}s{self.stages}x{self.split_k}"
                f"{'r' if self.reduce_each else 'd'}{'e' if self.evict else ''}")

    def per_thread(self) -> int:
        """W elements each thread loads per tile."""
        return self.block_n * self.block_k // (32 * self.warps)

    def smem(self) -> int:
        """Bytes of shared memory the cp.async pipeline buffers (W tiles; x's are small)."""
        return max(self.stages - 1, 0) * self.block_n * self.block_k * 2


def block_m(m: int) -> int:
    return 1 if m == 1 else 2 if m == 2 else 4


def gemv(x: torch.Tensor, w: torch.Tensor, cfg: Cfg, bug: str = "") -> torch.Tensor:
    """x [M <= 4, K] @ w[N, K].T -> [M, N] in x's dtype, by ``cfg``. ``bug`` injects a deliberate error
    (the tests' proof that the check sees one): skip_k_tile (each program one K tile short),
    skip_n_block (the last N block never runs), skip_split (the last K split never runs)."""
    assert bug in BUGS and x.dim() == 2 and x.shape[0] <= 4 and x.stride(1) == 1 and w.stride(1) == 1
    M, K = x.shape
    N = w.shape[0]
    split = cfg.split_k
    nt = triton.cdiv(triton.cdiv(K, split), cfg.block_k)
    even_k = K == split * nt * cfg.block_k
    alloc = torch.zeros if bug else torch.empty  # a skipped part must not find the right answer left over
    y = alloc((M, N), dtype=x.dtype, device=x.device)
    if split == 1:
        p, s_pk, s_pm = y, 0, y.stride(0)
    else:
        p = alloc((split, M, N), dtype=torch.float32, device=x.device)
        s_pk, s_pm = M * N, N
    grid = (triton.cdiv(N, cfg.block_n) - (bug == "skip_n_block"), split - (bug == "skip_split"))
    _gemv_kernel[grid](x, w, p, M, N, K, nt - (bug == "skip_k_tile"), x.stride(0), w.stride(0), s_pk, s_pm,
                       BLOCK_M=block_m(M), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                       EVEN_N=N % cfg.block_n == 0, EVEN_K=even_k, REDUCE_EACH=cfg.reduce_each,
                       EVICT=cfg.evict, STAGES=cfg.stages, num_warps=cfg.warps, num_stages=cfg.stages)
    if split > 1:
        _splitk_reduce_kernel[(triton.cdiv(N, RED_BLOCK), M)](p, y, N, split, s_pk, s_pm, y.stride(0),
                                                              BLOCK=RED_BLOCK, num_warps=4)
    return y


def check(y: torch.Tensor, ref: torch.Tensor, err_cublas: float) -> dict:
    """max |y - ref| (y the bf16 output, ref float64) against max(2 x cuBLAS's own error, REL x max |ref|):
    cuBLAS rounds once to bf16 (half an ulp: <= 2**-8 relative) over an fp32 sum. REL 2**-7 (two such at
    the largest outputs) on the GPU; 2**-6 under the interpreter, which rounds to bf16 toward zero (a
    whole ulp off) while torch's CPU x @ W.T, the stand-in for cuBLAS there, rounds to nearest."""
    err = (y.double() - ref).abs().max().item()
    tol = max(2.0 * err_cublas, (2.0 ** -6 if INTERPRET else 2.0 ** -7) * ref.abs().max().item())
    return {"err": err, "tol": tol, "ok": bool(err <= tol)}


# -- the tuning space --------------------------------------------------------------------------------

def space(n: int, k: int, m: int, stage: int = 1, around: list[Cfg] | None = None) -> list[Cfg]:
    """Stage 1: every (BLOCK_N, BLOCK_K, warps, SPLIT_K) with 8..64 W elements per thread, STAGES 1 and 3,
    REDUCE_EACH on, no eviction hint. Stage 2: each of ``around`` in every STAGES x REDUCE_EACH x EVICT.
    Only configs with K a multiple of SPLIT_K * BLOCK_K (the 7B's shapes then need no masks), at most
    ``SMEM_BUDGET`` of pipeline buffers, and a deferred [BLOCK_N, BLOCK_K] accumulator only where
    BLOCK_M x (elements per thread) <= 64 (more spills: the AOT check found 424 B at 4 x 64)."""
    def ok(c: Cfg) -> bool:
        return (8 <= c.per_thread() <= 64 and k % (c.split_k * c.block_k) == 0 and c.smem() <= SMEM_BUDGET
                and (c.reduce_each or block_m(m) * c.per_thread() <= 64))

    if stage == 1:
        cands = [Cfg(bn, bk, w, st, sk) for bn, bk, w, sk, st in
                 itertools.product((8, 16, 32, 64, 128), (64, 128, 256, 512, 1024), (2, 4, 8), (1, 2, 4, 8), (1, 3))]
        cands += [replace(c, stages=2) for c in cands if c.stages == 3 and not ok(c)]  # big tiles: 1 buffer
    else:
        cands = [replace(c, stages=st, reduce_each=r, evict=e) for c in around or []
                 for st, r, e in itertools.product((1, 2, 3, 4, 6), (True, False), ("", "evict_first"))]
    return sorted({c for c in cands if ok(c)})


def variant(c: Cfg, m: int) -> tuple:
    """What a compile depends on (split_k only through P's dtype); N, K and the strides are runtime."""
    return (block_m(m), m == 1, c.block_n, c.block_k, c.warps, c.stages, c.reduce_each, c.evict, c.split_k > 1)


# -- ahead-of-time compilation (no GPU needed) ---------------------------------------------------------

class _AOTDriver:
    """Stands in for Triton's CUDA driver in a compile-only process: the JIT's warm-up path then compiles
    for ``sm_<arch>`` (the H200: 90) without a GPU, into the same on-disk cache entry as a launch's."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0


def _job_args(job: tuple, n: int, k: int) -> tuple[list, dict]:
    bm, _, bn, bk, w, st, red, ev, f32 = job[:9]
    m = job[9]
    split = 2 if f32 else 1
    args = [torch.bfloat16, torch.bfloat16, torch.float32 if f32 else torch.bfloat16, m, n, k, 4, k, k,
            m * n if f32 else 0, n]
    kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "EVEN_N": n % bn == 0, "EVEN_K": k % (split * bk) == 0,
          "REDUCE_EACH": red, "EVICT": ev, "STAGES": st, "num_warps": w, "num_stages": st}
    return args, kw


def _compile_job(job: tuple, n: int, k: int, arch: int, inspect: bool) -> dict:
    """In a worker process: compile one variant through ``_gemv_kernel.warmup`` for sm_<arch>."""
    from triton.runtime.driver import driver

    if not isinstance(driver._active, _AOTDriver):
        driver.set_active(_AOTDriver(arch))
    rec = {"job": list(job)}
    t = time.perf_counter()
    try:
        args, kw = _job_args(job, n, k)
        ck = _gemv_kernel.warmup(*args, grid=(1,), **kw)
        if job[8]:  # the split-K reduction, once per worker is enough (cached)
            _splitk_reduce_kernel.warmup(torch.float32, torch.bfloat16, n, 4, job[9] * n, n, n, grid=(1,),
                                         BLOCK=RED_BLOCK, num_warps=4)
    except Exception as exc:  # the point of the check: say which variant and why
        rec["error"] = repr(exc)[:400]
        return rec
    rec["s"] = round(time.perf_counter() - t, 3)
    if inspect:
        rec["shared"] = ck.metadata.shared
        rec["cp_async"] = ck.asm["ptx"].count("cp.async.cg") + ck.asm["ptx"].count("cp.async.ca")
        rec["ld_v4"] = len(re.findall(r"ld\.global[.\w:]*\.v4\.b32", ck.asm["ptx"]))
        rec.update(res_usage(ck.asm["cubin"]))
    return rec


def res_usage(cubin: bytes) -> dict[str, int]:
    """A compiled kernel's registers per thread and its spills (``stack``, ``local`` bytes), from Triton's own
    cuobjdump; empty where it says nothing."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
    mm = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
    return dict(zip(("regs", "stack", "local"), (int(g) for g in mm.groups()), strict=True)) if mm else {}


def precompile(jobs: list[tuple], n: int, k: int, arch: int = 90, procs: int = 0,
               inspect: bool = False, job_fn=None) -> tuple[ProcessPoolExecutor | None, list]:
    """Start compiling ``jobs`` (variant + (M,)) in ``procs`` fresh processes; returns (pool, futures).
    ``job_fn(job, n, k, arch, inspect)`` compiles one (default ``_compile_job``: the GEMV's; mm_bench
    passes its own, a module-level function the spawned workers can import)."""
    procs = procs or min(16, os.cpu_count() or 1)
    if not jobs or procs < 1:
        return None, []
    pool = ProcessPoolExecutor(max_workers=procs, mp_context=multiprocessing.get_context("spawn"))
    return pool, [pool.submit(job_fn or _compile_job, j, n, k, arch, inspect) for j in jobs]


def wait_compiled(pool, futs) -> list[dict]:
    recs = []
    for f in futs:
        try:
            recs.append(f.result())
        except Exception as exc:  # a dead worker: the timing process compiles what is missing itself
            recs.append({"error": repr(exc)[:300]})
    if pool is not None:
        pool.shutdown()
    return recs


def aot_problems(recs: list[dict]) -> list[str]:
    bad = []
    for r in recs:
        tag = "M{9} bm{0} n{2} k{3} w{4} s{5} reduce_each={6} evict={7!r} f32={8}".format(*r.get("job", [None] * 10))
        if "error" in r:
            bad.append(f"{tag}: {r['error']}")
        elif r.get("local") or r.get("stack"):
            bad.append(f"{tag}: spills ({r.get('local')} B local, {r.get('stack')} B stack)")
        elif r.get("shared", 0) > SMEM_MAX:
            bad.append(f"{tag}: {r['shared']} B of shared memory")
        elif r["job"][5] > 1 and not r.get("cp_async"):
            bad.append(f"{tag}: STAGES {r['job'][5]} but the W loads are not pipelined (no cp.async)")
    return bad


def all_jobs(ms=MS, stage2: bool = True) -> list[tuple]:
    """Every variant the GPU run can compile: stage 1's, and stage 2's around any stage-1 config."""
    jobs = set()
    for m in ms:
        for n, k in SHAPES.values():
            s1 = space(n, k, m)
            cs = space(n, k, m, 2, s1) if stage2 else s1
            jobs |= {variant(c, m) + (m,) for c in cs}
    return sorted(jobs)


def compile_only(args) -> int:
    jobs = all_jobs(stage2=not args.stage1_only)
    if args.limit or args.sample:  # the heaviest (most accumulator registers per thread, then most
        def weight(j: tuple) -> tuple:  # pipeline buffers) and/or a seeded random sample
            bm, _, bn, bk, w, st, red = j[:7]
            per_thread = bn * bk // (32 * w)
            return (per_thread * (1 if red else bm), max(st - 1, 0) * bn * bk)

        heavy = sorted(jobs, key=weight)[-args.limit:] if args.limit else []
        rest = sorted(set(jobs) - set(heavy))
        jobs = heavy + random.Random(0).sample(rest, min(args.sample, len(rest)))
    t = time.perf_counter()
    if args.jobs == 1:  # in this process (no worker to start)
        recs = [_compile_job(j, 4096, 4096, args.arch, True) for j in jobs]
    else:
        recs = wait_compiled(*precompile(jobs, 4096, 4096, args.arch, args.jobs, inspect=True))
    bad = aot_problems(recs)
    for b in bad:
        print("PROBLEM", b)
    regs = [r["regs"] for r in recs if "regs" in r]
    summary = {"variants": len(recs), "clean": len(recs) - len(bad), "arch": args.arch, "wall_s": round(time.perf_counter() - t, 1),
               "compile_s_median": statistics.median([r["s"] for r in recs if "s" in r] or [0]),
               "regs_max": max(regs or [0]), "shared_max": max([r.get("shared", 0) for r in recs] or [0])}
    print(json.dumps(summary))
    print(f"{len(recs) - len(bad)} of {len(recs)} variants compile for sm_{args.arch} cleanly")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "variants": recs}, indent=1) + "\n")
    return 1 if bad else 0


# -- the CPU smoke run -----------------------------------------------------------------------------------

SMOKE_CFGS = (Cfg(16, 64, 2, 1), Cfg(16, 64, 2, 3, 2, False, "evict_first"), Cfg(8, 32, 1, 2, 4),
              Cfg(16, 128, 2, 2, 1, False))


def smoke_setup() -> None:
    """The interpreter's helpers for a smoke run (this script's and mm_bench's)."""
    from hfserve import (
        hfkernels as kernels,  # its shim lets the interpreter take a loaded scalar (NT) as a loop bound under numpy 2
    )

    kernels._interpreter_shim()
    try:  # the tests' vectorised tl.reduce for the interpreter (bit for bit its own, tests/hfserve): ~50x faster here
        import triton_interp

        triton_interp._vectorise_generic_reduce()
        triton_interp._cache_np_dtypes()
    except ImportError:
        pass


def smoke_cases(shapes: dict, g: torch.Generator) -> Iterator[tuple]:
    """The smoke runs' GEMM cases, every shape at each of its Ms, drawn from ``g`` in order: (shape, N, K, M,
    x, W, the float64 x @ W.T, the max |error| of torch's CPU bf16 x @ W.T against it: cuBLAS's role)."""
    for name, (n, k, ms) in shapes.items():
        w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            ref = x.double() @ w.double().t()
            yield name, n, k, m, x, w, ref, ((x @ w.t()).double() - ref).abs().max().item()


def smoke(bug: str = "", shapes: dict | None = None, cfgs=SMOKE_CFGS) -> dict:
    """Interpreted (TRITON_INTERPRET=1) on the CPU: every cfg at every tiny shape and its Ms, against the
    float64 x @ W.T, cuBLAS's role played by torch's CPU ``x @ W.T`` in bf16. No timing."""
    smoke_setup()
    rows = []
    for name, n, k, m, x, w, ref, err_c in smoke_cases(shapes or SMOKE_SHAPES, torch.Generator().manual_seed(0)):
        for c in cfgs:
            rec = check(gemv(x, w, c, bug), ref, err_c)
            rows.append({"shape": name, "N": n, "K": k, "M": m, "cfg": c.label(), "err_cublas": err_c, **rec})
    return {"ok": all(r["ok"] for r in rows), "bug": bug, "rows": rows}


# -- timing on the GPU -----------------------------------------------------------------------------------

def graph_us(calls: list, reps: int) -> float:
    """Median over ``reps`` replays of one CUDA graph of ``calls`` (run in order), per call, microseconds."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    t = statistics.median(a.elapsed_time(b) for a, b in ev)
    del g
    return 1e3 * t / len(calls)


def eager_us(calls: list, reps: int) -> float:
    """Median of single calls, each alone (synchronised before), CUDA events around the launch."""
    for c in calls[:2]:
        c()
    out = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        calls[i % len(calls)]()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return 1e3 * statistics.median(out)


class Case:
    """One (shape, M): its x, rotating weights, float64 reference, and every Triton config timed so far."""

    def __init__(self, name: str, n: int, k: int, m: int, ws: list[torch.Tensor], gen: torch.Generator) -> None:
        self.name, self.n, self.k, self.m, self.ws = name, n, k, m, ws
        self.x = torch.randn(m, k, device=ws[0].device, generator=gen).to(torch.bfloat16)
        self.ref = self.x.double() @ ws[0].double().t()
        self.err_cublas = (F.linear(self.x, ws[0]).double() - self.ref).abs().max().item()
        self.timed: dict[Cfg, float] = {}
        self.failed: list[str] = []
        self.planned = 0

    def launch(self, x: torch.Tensor, w: torch.Tensor, c) -> torch.Tensor:
        """The kernel under test with config ``c`` (mm_bench's subclass launches its own)."""
        return gemv(x, w, c)

    def calls(self, fn) -> list:
        """CALLS calls of ``fn(x, W)``, call i on weight copy i (mod copies): no two in a row share memory."""
        return [lambda w=self.ws[i % len(self.ws)]: fn(self.x, w) for i in range(CALLS)]

    def time_cfg(self, c: Cfg, reps: int) -> float:
        """Graph time of ``c`` (us per call), after its output passed ``check``; inf if it failed or broke."""
        try:
            if c not in self.timed:
                t = time.perf_counter()
                y = self.launch(self.x, self.ws[0], c)  # the first launch: a compile, or a load from the AOT cache
                FIRST_CALL_S.append(time.perf_counter() - t)
                res = check(y, self.ref, self.err_cublas)
                if not res["ok"]:
                    self.failed.append(f"{c.label()}: err {res['err']:.3g} > tol {res['tol']:.3g}")
                    self.timed[c] = math.inf
                    return math.inf
            elif not math.isfinite(self.timed[c]):
                return math.inf
            self.timed[c] = graph_us(self.calls(lambda x, w, c=c: self.launch(x, w, c)), reps)
        except Exception as exc:  # a config that does not launch (resources, compiler) is dropped, not fatal
            self.failed.append(f"{c.label()}: {repr(exc)[:200]}")
            self.timed[c] = math.inf
        return self.timed[c]

    def best(self, k: int = 3) -> list[Cfg]:
        return sorted((c for c, t in self.timed.items() if math.isfinite(t)), key=self.timed.get)[:k]


def _tune(cases: list[Case], cfgs: dict, until: float, reps: int = 3) -> None:
    """Time each case's ``cfgs[id(case)]`` (shuffled: a cut leaves an even sample) until the deadline,
    which is shared out evenly over the cases still to go."""
    for i, cs in enumerate(cases):
        todo = [c for c in cfgs[id(cs)] if c not in cs.timed]
        random.Random(cs.n * 31 + cs.k * 7 + cs.m).shuffle(todo)
        stop = time.perf_counter() + max(until - time.perf_counter(), 0.0) / (len(cases) - i)
        for c in todo:
            if time.perf_counter() > stop:
                break
            cs.time_cfg(c, reps)


def gpu(args, device: str = "cuda", shapes: dict | None = None, layers: int = LAYERS) -> dict:
    """The H200 run (``device``, ``shapes`` and ``layers`` are for the CPU test of this control flow)."""
    t0 = time.perf_counter()
    shapes = shapes or SHAPES
    arch = 90

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:5.1f}s] {msg}", flush=True)

    res: dict = {"meta": {"triton": triton.__version__, "torch": torch.__version__, "calls_per_graph": CALLS,
                          "reps": args.reps, "budget_s": args.budget_s}, "pool": {}, "cases": []}
    # Stage 1's variants compile in other processes while this one sets up (weights, references).
    jobs1 = sorted({variant(c, m) + (m,) for m in MS for n, k in shapes.values() for c in space(n, k, m)})
    pool, futs = precompile(jobs1, 4096, 4096, arch, args.jobs) if device == "cuda" else (None, [])
    gen = torch.Generator(device=device).manual_seed(0)
    if device == "cuda":
        dev = torch.cuda.get_device_properties(0)
        res["meta"].update(device=dev.name, sms=dev.multi_processor_count,
                           l2_mb=getattr(dev, "L2_cache_size", 0) / 2 ** 20)
    # 32 layers' weights for the layer shapes (the rotation copies of their per-shape timings too), 2 lm_heads
    weights = {name: [(torch.randn(n, k, device=device, generator=gen) * k ** -0.5).to(torch.bfloat16)
                      for _ in range(layers if name in LAYER_SHAPES else 2)] for name, (n, k) in shapes.items()}
    cases = [Case(name, n, k, m, weights[name], gen) for name, (n, k) in shapes.items() for m in MS]
    log(f"weights and references ready; waiting for {len(jobs1)} stage-1 compiles")
    recs = wait_compiled(None, futs)
    res["pool"]["stage1"] = {"variants": len(jobs1), "errors": [r for r in recs if "error" in r][:5],
                             "s": round(time.perf_counter() - t0, 1)}
    log(f"stage 1: {len(jobs1)} variants compiled")

    # Stage 1: the whole grid per case until 55% of the budget.
    _tune(cases, {id(cs): space(cs.n, cs.k, cs.m) for cs in cases}, t0 + 0.55 * args.budget_s)
    for cs in cases:
        cs.planned = len(space(cs.n, cs.k, cs.m))
        b = cs.best(1)
        best = f"{b[0].label()} {cs.timed[b[0]]:.1f} us" if b else "-"
        log(f"{cs.name} M={cs.m}: stage 1 timed {len(cs.timed)}/{cs.planned}, best {best}, {len(cs.failed)} failed")
    # Stage 2: STAGES x REDUCE_EACH x EVICT around each case's 2 best, until 85% of the budget.
    around = {id(cs): space(cs.n, cs.k, cs.m, 2, cs.best(2)) for cs in cases}
    jobs2 = sorted({variant(c, cs.m) + (cs.m,) for cs in cases for c in around[id(cs)]} - set(jobs1))
    t = time.perf_counter()
    if device == "cuda" and pool is not None:
        futs = [pool.submit(_compile_job, j, 4096, 4096, arch, False) for j in jobs2]
        recs = wait_compiled(None, futs)
    res["pool"]["stage2"] = {"variants": len(jobs2), "errors": [r for r in recs if "error" in r][:5],
                             "s": round(time.perf_counter() - t, 1)}
    if pool is not None:
        pool.shutdown()
    log(f"stage 2: {len(jobs2)} more variants compiled")
    _tune(cases, around, t0 + 0.85 * args.budget_s)
    log("stage 2 timed; finals")

    # Finals: the best 3 again at full length; cuBLAS's forms; eager.
    for cs in cases:
        fin = {c: cs.time_cfg(c, args.reps) for c in cs.best(3)}
        best = min(fin, key=fin.get) if fin else None
        wb = cs.n * cs.k * 2
        row = {"shape": cs.name, "N": cs.n, "K": cs.k, "M": cs.m, "weight_mb": wb / 1e6,
               "configs_timed": len(cs.timed), "configs_stage1": cs.planned, "failed": cs.failed[:5],
               "n_failed": len(cs.failed), "tol": check(F.linear(cs.x, cs.ws[0]), cs.ref, cs.err_cublas)["tol"],
               "best_cfg": asdict(best) if best else None, "best_label": best.label() if best else "-",
               "finalists_us": {c.label(): fin[c] for c in fin}}
        forms = {"linear": lambda x, w: F.linear(x, w), "matmul": lambda x, w: torch.matmul(x, w.t())}
        if cs.m == 1:
            forms["mv"] = lambda x, w: torch.mv(w, x[0])
        if best is not None:
            forms["triton"] = lambda x, w, c=best: gemv(x, w, c)
        for f, fn in forms.items():
            row[f"{f}_err"] = (fn(cs.x, cs.ws[0]).reshape(cs.m, cs.n).double() - cs.ref).abs().max().item()
            row[f"{f}_graph_us"] = graph_us(cs.calls(fn), args.reps)
            row[f"{f}_eager_us"] = eager_us(cs.calls(fn), 30)
            row[f"{f}_gbs"] = wb / row[f"{f}_graph_us"] / 1e3
        row["speedup_vs_cublas"] = row["linear_graph_us"] / row.get("triton_graph_us", math.inf)  # > 1: Triton faster
        res["cases"].append(row)
        log(f"{cs.name} M={cs.m}: cuBLAS {row['linear_graph_us']:.1f} us, triton "
            f"{row.get('triton_graph_us', math.inf):.1f} us ({row['best_label']})")
    res["layer"] = layer_sequence(cases, res["cases"], weights, args.reps, layers)
    fc = sorted(FIRST_CALL_S)
    res["pool"]["first_call_s"] = {"n": len(fc), "median": fc[len(fc) // 2] if fc else None,
                                   "p90": fc[int(0.9 * len(fc))] if fc else None, "sum": sum(fc)}
    res["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def layer_sequence(cases: list[Case], rows: list[dict], weights: dict, reps: int, layers: int = LAYERS) -> dict:
    """QKV, O, gate_up, down at M=1 for all 32 layers in one graph: cuBLAS (F.linear), the best Triton
    config per shape, and per shape the faster of the two by the per-shape graph times."""
    by = {cs.name: cs for cs in cases if cs.m == 1}
    row = {r["shape"]: r for r in rows if r["M"] == 1}
    out: dict = {"layers": layers}
    if any(r["best_cfg"] is None for r in row.values()):
        out["skipped"] = "a shape has no Triton config that passed"
        return out
    tri = {s: Cfg(**row[s]["best_cfg"]) for s in LAYER_SHAPES}
    lin = {s: (lambda x, w: F.linear(x, w)) for s in LAYER_SHAPES}
    trif = {s: (lambda x, w, c=tri[s]: gemv(x, w, c)) for s in LAYER_SHAPES}
    faster = {s: row[s]["triton_graph_us"] < row[s]["linear_graph_us"] for s in LAYER_SHAPES}
    fastest = {s: trif[s] if faster[s] else lin[s] for s in LAYER_SHAPES}
    out.update(cfgs={s: tri[s].label() for s in LAYER_SHAPES},
               best_of={s: "triton" if faster[s] else "cublas" for s in LAYER_SHAPES})
    for name, fns in (("cublas", lin), ("triton", trif), ("best_of", fastest)):
        calls = [lambda f=fns[s], x=by[s].x, w=weights[s][li]: f(x, w) for li in range(layers) for s in LAYER_SHAPES]
        out[f"{name}_ms"] = graph_us(calls, reps) * len(calls) / 1e3
    out["weight_gb"] = sum(by[s].n * by[s].k * 2 for s in LAYER_SHAPES) * layers / 1e9
    for name in ("cublas", "triton", "best_of"):
        out[f"{name}_gbs"] = out["weight_gb"] / out[f"{name}_ms"] * 1e3
    lm = row.get("lm_head")
    out["lm_head_gain_us"] = lm["linear_graph_us"] - lm["triton_graph_us"] if lm else 0.0
    out["step_gain_ms"] = out["cublas_ms"] - out["best_of_ms"] + max(out["lm_head_gain_us"], 0.0) / 1e3
    return out


def cell(row: dict, key: str, fmt: str) -> str:
    """A table cell: ``row[key]`` formatted, ``-`` where the row has no such value."""
    return format(row[key], fmt) if key in row else "-"


def table(res: dict) -> str:
    """The stdout table: graph times (us per call), GB/s of weights, speedup = cuBLAS / Triton (> 1: Triton
    faster), eager times, max |error| vs float64, the winning config (configs timed / stage-1 grid)."""
    lines = [f"{'shape':8} {'M':>1} {'MB':>6} | {'cuBLAS us':>9} {'GB/s':>5} {'matmul':>7} {'mv':>7} | "
             f"{'triton us':>9} {'GB/s':>5} {'speedup':>7} | {'eager cuBLAS/triton us':>22} | "
             f"{'err cuBLAS/triton':>17} | best (timed/stage-1 grid, failed)"]
    for r in res["cases"]:
        f = functools.partial(cell, r)
        lines.append(f"{r['shape']:8} {r['M']:>1} {r['weight_mb']:6.1f} | {f('linear_graph_us', '9.1f')} "
                     f"{f('linear_gbs', '5.0f')} {f('matmul_graph_us', '7.1f')} {f('mv_graph_us', '7.1f'):>7} | "
                     f"{f('triton_graph_us', '9.1f'):>9} {f('triton_gbs', '5.0f'):>5} {r['speedup_vs_cublas']:7.3f} | "
                     f"{f('linear_eager_us', '10.1f')} / {f('triton_eager_us', '9.1f'):>9} | "
                     f"{f('linear_err', '.2e')}/{f('triton_err', '.2e')} | {r['best_label']} "
                     f"({r['configs_timed']}/{r['configs_stage1']}, {r['n_failed']})")
    lay = res.get("layer")
    if lay and "cublas_ms" in lay:
        lines.append(f"{lay['layers']} layers (QKV, O, gate_up, down; {lay['weight_gb']:.1f} GB) in one graph: cuBLAS "
                     f"{lay['cublas_ms']:.3f} ms ({lay['cublas_gbs']:.0f} GB/s), triton {lay['triton_ms']:.3f} ms "
                     f"({lay['triton_gbs']:.0f} GB/s), best-of {lay['best_of_ms']:.3f} ms {lay['best_of']}; "
                     f"lm_head gain {lay['lm_head_gain_us']:.1f} us; decode-step gain {lay['step_gain_ms']:.3f} ms")
    return "\n".join(lines)


def bench_parser(doc: str, budget_s: float, budget_help: str) -> argparse.ArgumentParser:
    """The options this bench and mm_bench share: device, output file, replays, wall budget."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default="")
    ap.add_argument("--reps", type=int, default=25, help="graph replays per final timing (median)")
    ap.add_argument("--budget-s", type=float, default=budget_s, help=budget_help)
    return ap


def run(args: argparse.Namespace, smoke: Callable[[str], dict], what: Callable[[dict], str],
        gpu: Callable[[argparse.Namespace], dict], table: Callable[[dict], str], json_default=None) -> int:
    """The smoke run (``--device cpu``: a line per check, ``what`` names it) or the GPU run (its table); the
    result written to ``--out``; exit 1 where a check failed."""
    if args.device == "cpu":
        if not INTERPRET:
            raise SystemExit("--device cpu needs TRITON_INTERPRET=1 when triton is imported (run as a script)")
        res = smoke(args.bug)
        for r in res["rows"]:
            print(f"{what(r)} err {r['err']:.3e} tol {r['tol']:.3e} {'ok' if r['ok'] else 'FAIL'}")
        print("smoke", "ok" if res["ok"] else "FAILED", f"({len(res['rows'])} checks, bug={args.bug!r})")
    else:
        res = gpu(args)
        print(table(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=json_default) + "\n")
    return 0 if res.get("ok", True) else 1


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, 90.0, "rough wall budget of the tuning (GPU)")
    ap.add_argument("--jobs", type=int, default=0, help="compile processes (0: min(16, cpus))")
    ap.add_argument("--bug", choices=BUGS, default="", help="smoke: inject a deliberate kernel error")
    ap.add_argument("--compile-only", action="store_true", help="compile the space for --arch, no GPU")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--stage1-only", action="store_true", help="--compile-only: stage 1's variants only")
    ap.add_argument("--limit", type=int, default=0, help="--compile-only: the heaviest this many variants")
    ap.add_argument("--sample", type=int, default=0, help="--compile-only: and a seeded sample of this many")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(args)
    return run(args, smoke, lambda r: f"{r['shape']:8} N={r['N']:<4} K={r['K']:<4} M={r['M']} {r['cfg']:22}", gpu, table)


if __name__ == "__main__":
    sys.exit(main())
