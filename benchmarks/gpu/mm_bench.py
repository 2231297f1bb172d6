"""Batch 16..64 decode on the H200: a skinny Triton GEMM against cuBLAS, and decode attention's launch parameters.

    python benchmarks/gpu/mm_bench.py [--out mm.json] [--budget-s 110]       # on the H200 (one command)
    python benchmarks/gpu/mm_bench.py --device cpu [--bug skip_k_tile]       # smoke: interpreter, tiny shapes
    python benchmarks/gpu/mm_bench.py --compile-only [--jobs N] [--glu-only|--fuse-only]  # stage 1's variants, sm_90
    python benchmarks/gpu/mm_bench.py --attn-only --kv bf16,fp8 [--out a.json] # attention over both pools (H200)
    python benchmarks/gpu/mm_bench.py --glu-only [--out g.json]              # gate/up + SwiGLU in one launch (H200)
    python benchmarks/gpu/mm_bench.py --fuse-only [--out f.json]             # --mm-norm's launches (H200)

Scenario C: 64 requests decode at batch 64, where one step is 6.63 ms = GEMM 4.10 (cuBLAS, ~81% of
the 4.27 TB/s copy ceiling) + attention 1.44 (~78%) + the rest. Two parts, one command:

GEMM. y = x @ W.T in bf16, W [N, K] row-major, x [M, K], M in {16, 32, 64} (the engine's batch buckets), at
the Mistral-7B shapes (gemv_bench's ``SHAPES``), random weights. cuBLAS (``F.linear``, the engine's call,
every ratio is against it) vs ``_mm_kernel`` (hfserve.hfkernels, ``mm_gemm``): one program per
BLOCK_N rows of W and per K split, BLOCK_M = the M bucket (each W tile read once), tl.dot in float32
accumulation (wgmma where the dot's M side is >= 64; SWAP computes W @ x.T so that side is BLOCK_N),
num_stages pipelining, evict_first on W, deterministic split-K (float32 partials, fixed-order reduce).
The space (``space()``): stage 1 every BLOCK_N 32..256 x BLOCK_K 64/128 x warps 4/8 x STAGES 3/5 x SWAP x
SPLIT_K 1/2/4/8 within shared memory, accumulator registers and K; stage 2 STAGES 2..6 x EVICT around each
case's 2 best; the best 3 timed again at full length. Timing, checks and the compile pool are gemv_bench's
(imported): CUDA graphs of 20 calls over distinct weight copies (L2 never holds the weights), every timed
config checked against float64 (``check``), kernels compiled ahead in ``--jobs`` processes (``_AOTDriver``).
It prints, and writes in the JSON (``mm_configs``), the ``MM_CONFIGS`` table for hfserve.hfkernels: the winners
where Triton beat cuBLAS by more than ``--margin`` (1%), and the step gain they add up to (32 layers).

Attention. ``decode_attn`` (hfserve.hfkernels: ``_decode_attn_kernel`` unsplit, ``_decode_attn_split_kernel`` +
``_attn_reduce_kernel`` split-KV) at batch 64 and 4, 32 q / 8 kv heads of 128, positions uniform in
511..639 (C's served range; context bucket 1024), graphs of 20 calls over 16 layers' KV (4.3 GB, never in
L2): every splits x BLOCK_N x warps x stages x bf16-or-float32 dots (``attn_space()``) against today's launch
(``AttnCfg()``: K/V widened to float32, tf32 dots),
GB/s of K/V actually read (sum over rows of (pos + 1) x 8 heads x 128 x 2 bytes x 2; x 1 byte over an fp8 pool).
It prints the ``ATTN_CONFIGS`` entries that beat today's by more than the margin, and with ``--kv fp8`` the
``ATTN_LOWP_FP8`` ones (bf16-dot winners over the fp8 pool, with or without ``reg``).

GLU (``--glu-only``, ``--mm-glu``'s launch). The gate/up GEMM with SwiGLU in its epilogue (``mm_gemm(..., glu=
INTER)``: a gate and an up tile of W per K step, two accumulators, the output [M, INTER] rounded as silu_mul
rounds the GEMM's) over ``glu_space()`` at each M, against today's two launches (``mm_linear`` + ``silu_mul``:
what the engine runs without ``--mm-glu``); the reference is SwiGLU of the float64 GEMM. It prints the
``MM_GLU_CONFIGS`` entries that beat today's by more than the margin and the step gain (32 layers).
Prediction (2026-12-04, before any GPU number): at M=64 the GLU launch reads the same 235 MB at the same
~91% of the ceiling as the tuned gate/up launch (60 us) and saves silu_mul's launch (~2 us, its 3.7 MB in and
1.8 MB out), the GEMM's own write of those 3.7 MB (~1 us) and the launch gap (~1-1.5 us in a graph): 62-64 ->
60-61 us, -0.09..-0.13 ms per batch-64 step, C's burst -11..-17 ms (~0.3-0.4 points of its floor); at M=16/32
~3 us per layer.

Fused (``--fuse-only``, ``--mm-norm``'s launches, at 16 and 64 rows). "norm": the GEMM of the residual stream x with
RMSNorm(x) * ln in its prologue (each x tile times ln's slice, rounded, into the dot; the rows' sums of squares in the
same K loop; the scale on the accumulator), against today's GEMM over the normed x; "glu_norm" the same in the GLU
launch (against --mm-glu's); "res": the GEMM with the residual add in its epilogue (split-K: in the reduction),
against today's GEMM then add_rmsnorm (the add and the next norm: the launch --mm-norm removes). Spaces: the GEMM's
(one split for norm), the GLU launch's. It prints ``MM_FUSE_CONFIGS`` (winners only) and per M the step's gain with
--mm-norm, alone and with --mm-glu. Prediction (2026-12-05, before any GPU number): at 64 rows each add_rmsnorm is
~2.3 us of kernel + ~0.7 us of gap (profile_c_served_step9: 65 calls, 0.148 ms a step); RES adds one read of a
[64, 4096] tile (~0.2 us); NORM costs the x tile a pass through registers each K step: with SWAP (qkv's launch) the
tile goes back to shared memory for the dot (135 registers against 64, a fence a step), without it the dot takes it
from registers: +0..2 us on qkv, +0..1 us on gate/up and lm_head. Per layer -2.5..-5.5 us, **-0.08..-0.18 ms a
batch-64 step (C's burst -10..-23 ms)**; at 16 rows (D's batch 4) about the same per layer. A NORM launch may lose
to today's at SWAP (qkv): the sweep then lists only the ones that win, and the step keeps the others' norm launches.

GPU command (one ``nvidia-h200`` call, from the repository root; ~130 s: ~15 s of parallel compiles, the
budget's tuning, finals and the attention sweep)::

    PYTHONPATH=/tmp/site:$PWD timeout 170 python3 benchmarks/gpu/mm_bench.py --out $OUT/mm.json 2>&1 | tee $OUT/mm.log

Prediction (2026-12-03, before any GPU number of this script): cuBLAS at M=64 streams the weights at ~81%
of the copy ceiling (the profile's 4.10 ms for 14.2 GB); the best Triton config reaches ~86-90% on gate_up,
down and lm_head (long streams, enough N tiles with BLOCK_N 128 + split-K; the M=1 GEMV reached ~96%), ~80-85%
on QKV and O (33-50 MB: ramp-up and tail, split-K's second launch ~2 us), i.e. speedup 1.04-1.10 on the big
three and 0.97-1.05 on the small two; SWAP (wgmma at every M) wins most cases at M=16 and 32, where cuBLAS is
nearer its ceiling already (~85%) and Triton wins by 0-5%. Decode step at batch 64: projections ~88% of the
ceiling overall, GEMM 4.10 -> ~3.80 ms (-0.3 ms). Attention at batch 64: today's launch (unsplit, 512
programs, ~3.9 waves on 132 SMs, K/V widened to float32: ~150 registers per thread) ~78%; the best config
has bf16 dots (half the registers, no conversions) and ~85-88%: 1.44 -> ~1.30 ms per step (-0.1 to -0.15
ms); splitting at batch 64 does not help (the bucket of 1024 over contexts of 512-640 makes uneven splits);
at batch 4 today's 5 splits stay within 5% of the best on the split count, bf16 dots worth ~5%.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # before triton is imported: @triton.jit reads TRITON_INTERPRET when it runs
    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]:
        os.environ["TRITON_INTERPRET"] = "1"
    if "--compile-only" in sys.argv:
        os.environ.pop("TRITON_INTERPRET", None)

import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from dataclasses import astuple, replace  # noqa: E402

import gemv_bench as G  # noqa: E402  (timing, checks, compile pool; it imports hfserve.hfkernels the right way)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

kernels = G.kernels
MmCfg, AttnCfg = kernels.MmCfg, kernels.AttnCfg
SHAPES, LAYER_SHAPES, LAYERS, CALLS = G.SHAPES, G.LAYER_SHAPES, G.LAYERS, G.CALLS
MS = (16, 32, 64)
FUSE_MS = (16, 64)  # --fuse-only's row buckets: D's batch 4 (16) and C's 64
FUSE_SHAPES = (("norm", "qkv"), ("norm", "gate_up"), ("norm", "lm_head"), ("glu_norm", "gate_up"), ("res", "o"),
               ("res", "down"))
EPS = 1e-5  # the 7B's rms_norm_eps
CEILING_GBS = 4270.0  # the H200's measured copy ceiling (docs/results.md, sol.json)
SMEM_BUDGET = 220 * 1024  # of the SM's 227 KB: STAGES x (BLOCK_N + BLOCK_M) x BLOCK_K x 2 bytes of tiles
BUGS = ("", "skip_k_tile", "attn_short")
# attention: the served C shape
NH, NKV, HD, ATTN_CTX, ATTN_LAYERS, ATTN_BS = 32, 8, 128, 1024, 16, (64, 4)
POS_LO, POS_HI = 511, 639
KV_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}  # the pool's dtypes (--kv-cache-dtype auto / fp8)
SMOKE_SHAPES = {"even": (64, 256, (16, 64)), "ragged": (40, 320, (20,))}  # (N, K, Ms): N, K short of tiles
SMOKE_CFGS = (MmCfg(16, 64, 4, 2), MmCfg(32, 32, 4, 3, 2, True), MmCfg(16, 32, 4, 1, 4, False, ""))
SMOKE_ATTN = (AttnCfg(), AttnCfg(1, 16, 2, 1), AttnCfg(3, 16, 4, 3), AttnCfg(2, 32, 8, 2, True), AttnCfg(1, 16, 4, 2, True))


# -- the tuning spaces ------------------------------------------------------------------------------------

def smem(c: MmCfg, m: int) -> int:
    return c.stages * (c.block_n + kernels.mm_rows(m)) * c.block_k * 2


def space(n: int, k: int, m: int, stage: int = 1, around: list[MmCfg] | None = None) -> list[MmCfg]:
    """Stage 1: BLOCK_N x BLOCK_K x warps x STAGES 3/5 x SWAP x SPLIT_K, evict_first. Stage 2: each of
    ``around`` at STAGES 2..6 x EVICT. Kept: K a multiple of SPLIT_K x BLOCK_K, tiles within SMEM_BUDGET,
    <= 128 accumulator registers per thread, <= 2048 programs."""
    bm = kernels.mm_rows(m)

    def ok(c: MmCfg) -> bool:
        return (k % (c.split_k * c.block_k) == 0 and smem(c, m) <= SMEM_BUDGET
                and c.block_n * bm <= 128 * 32 * c.warps and triton.cdiv(n, c.block_n) * c.split_k <= 2048)

    if stage == 1:
        cands = [MmCfg(bn, bk, w, st, sk, sw) for bn, bk, w, st, sw, sk in
                 itertools.product((32, 64, 128, 256), (64, 128), (4, 8), (3, 5), (False, True), (1, 2, 4, 8))]
    else:
        cands = [replace(c, stages=st, evict=e) for c in around or []
                 for st, e in itertools.product((2, 3, 4, 5, 6), ("", "evict_first"))]
    return sorted({c for c in cands if ok(c)}, key=astuple)


def variant(c: MmCfg, m: int, glu: bool = False, kind: str = "") -> tuple:
    """What a compile depends on: ("mm", BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, SWAP, EVICT, float32 P), and
    True last for a GLU launch (gate/up + SwiGLU: --mm-glu); a --mm-norm launch (``kind`` "norm", "glu_norm" or
    "res") appends (GLU, NORM, RES)."""
    base = ("mm", kernels.mm_rows(m), c.block_n, c.block_k, c.warps, c.stages, c.swap, c.evict, c.split_k > 1)
    if kind:
        return (*base, kind == "glu_norm", kind != "res", kind == "res")
    return (*base, *((True,) if glu else ()))


def fuse_space(kind: str, n: int, k: int, m: int) -> list[MmCfg]:
    """A --mm-norm launch's space: "res" the GEMM's (split-K adds in its reduction), "norm" the GEMM's with one split
    (the sums of squares need the whole row), "glu_norm" the GLU launch's."""
    if kind == "glu_norm":
        return glu_space(n, k, m)
    return [c for c in space(n, k, m) if kind == "res" or c.split_k == 1]


def glu_space(n: int, k: int, m: int) -> list[MmCfg]:
    """The GLU launch's space (W = [gate; up] of n rows, one split): BLOCK_N (output columns: a gate and an up tile
    each) x BLOCK_K x warps x STAGES 3-5 x SWAP, evict_first; kept where both tiles' stages fit SMEM_BUDGET and
    the two accumulators <= 128 registers per thread."""
    bm = kernels.mm_rows(m)

    def ok(c: MmCfg) -> bool:
        return (k % c.block_k == 0 and c.stages * (2 * c.block_n + bm) * c.block_k * 2 <= SMEM_BUDGET
                and 2 * c.block_n * bm <= 128 * 32 * c.warps and triton.cdiv(n // 2, c.block_n) <= 2048)

    cands = [MmCfg(bn, bk, w, st, 1, sw) for bn, bk, w, st, sw in
             itertools.product((32, 64, 128), (64, 128), (4, 8), (3, 4, 5), (False, True))]
    return sorted({c for c in cands if ok(c)}, key=astuple)


def attn_space(B: int, fp8: bool = False) -> list[AttnCfg]:
    """splits (today's rule, 1, 2, 3, 4 at batch >= 32; 8, 16 below) x BLOCK_N 16..128 x warps 2/4/8 x stages
    1..4 (BLOCK_N 128: 8 warps only) x float32 or bf16 dots, and today's launch; over an fp8 pool the bf16-dot
    ones also with the tiles widened in registers before shared memory (``reg=True``, the kernels' LOWP 3)."""
    splits = (0, 1, 2, 3, 4) if B >= 32 else (0, 1, 2, 4, 8, 16)
    cands = [AttnCfg(s, bn, w, st, lp) for s, bn, w, st, lp in
             itertools.product(splits, (16, 32, 64, 128), (2, 4, 8), (1, 2, 3, 4), (False, True))]
    cands = [c for c in cands if c.block_n < 128 or c.warps == 8]
    return cands + ([replace(c, reg=True) for c in cands if c.lowp] if fp8 else []) + [AttnCfg()]


def attn_splits(c: AttnCfg, B: int) -> int:
    return c.splits or kernels.split_count(B, NKV, ATTN_CTX, 132)


def attn_variants(B: int, fp8: bool = False) -> set[tuple]:
    """("attn", split?, BLOCK_N, warps, stages, LOWP[, True: an fp8 pool]) per config, ("attn_red", BLOCK_S) per
    split count."""
    out = set()
    for c in attn_space(B, fp8):
        s = attn_splits(c, B)
        per = triton.cdiv(ATTN_CTX, s)
        bn = c.block_n or (min(64, max(16, triton.next_power_of_2(per))) if s > 1 else 64)
        lowp = (3 if fp8 and c.reg else 1) if c.lowp else 0  # the kernels' LOWP (AttnCfg.lowp_mode on the GPU)
        out.add(("attn", s > 1, bn, c.warps, c.stages, lowp, *((True,) if fp8 else ())))
        if s > 1:
            out.add(("attn_red", max(8, triton.next_power_of_2(s))))
    return out


# -- ahead-of-time compilation (gemv_bench's pool; this module's jobs) ------------------------------------

def _compile(job: tuple, n: int, k: int, arch: int, inspect: bool = False) -> dict:
    """In a worker process: compile one variant for sm_<arch> through the JIT's warm-up path."""
    from triton.runtime.driver import driver

    if not isinstance(driver._active, G._AOTDriver):
        driver.set_active(G._AOTDriver(arch))
    rec = {"job": list(job)}
    t = time.perf_counter()
    bf, f32 = torch.bfloat16, torch.float32
    try:
        if job[0] == "mm":  # ("mm", BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, SWAP, EVICT, split-K partials[, GLU[, NORM, RES]])
            _, bm, bn, bk, w, st, sw, ev, part, *fuse = job
            glu, norm, res = (bool(f) for f in (*fuse, False, False, False)[:3])
            out_n = n // 2 if glu else n  # GLU: W is [gate; up], the output half as wide
            ck = kernels._mm_kernel.warmup(bf, bf, f32 if part else bf, bm, out_n, k, 4, k, k, bm * n if part else 0,
                                           out_n, out_n if glu else 0, bf, bf, out_n, 1e-5, grid=(1,), BLOCK_M=bm,
                                           BLOCK_N=bn, BLOCK_K=bk, EVEN_N=True, EVEN_K=True, SWAP=sw, EVICT=ev,
                                           STAGES=st, F32=False, GLU=glu, NORM=norm, RES=res and not part,
                                           num_warps=w, num_stages=st)
            if inspect:  # Hopper's wgmma, the shared memory the pipeline takes, registers and spills
                rec["wgmma"] = "warp_group_dot" in ck.asm["ttgir"]
                rec["shared"] = ck.metadata.shared
                rec.update(G.res_usage(ck.asm["cubin"]))
            if part:
                kernels._splitk_reduce_kernel.warmup(f32, bf, n, 4, bm * n, n, n, grid=(1,),
                                                     BLOCK=kernels.MM_RED_BLOCK, RES=res, num_warps=4)
        elif job[0] == "attn":  # ("attn", split, block_n, warps, stages, LOWP[, fp8 KV pool])
            _, split, bn, w, st, lowp, *kv8 = job
            kv = torch.float8_e4m3fn if kv8 and kv8[0] else bf
            s_kb, s_kh = NKV * ATTN_CTX * HD, ATTN_CTX * HD
            meta = dict(G=NH // NKV, HD=HD, BLOCK_G=16, BLOCK_D=HD, BLOCK_N=bn, PREC="tf32", LOWP=lowp, num_warps=w,
                        num_stages=st, grid=(1,))
            if split:
                ck = kernels._decode_attn_split_kernel.warmup(bf, kv, kv, torch.int64, f32, f32, f32, ATTN_CTX, 2, 512,
                                                              0.1, NH * HD, HD, s_kb, s_kh, HD, NH=NH, **meta)
            else:
                ck = kernels._decode_attn_kernel.warmup(bf, kv, kv, torch.int64, bf, ATTN_CTX, 0.1, NH * HD, HD, s_kb,
                                                        s_kh, HD, NH * HD, **meta)
            if inspect:  # byte-wide reads from shared memory: an fp8 operand gathered along the context
                rec["byte_loads"] = ck.asm["ptx"].count("ld.shared.b8")
                rec["ldmatrix"] = ck.asm["ptx"].count("ldmatrix")
        elif job[0] == "rope":  # ("rope", rows per program (1: the decode step's kernel), fp8 KV pool)
            _, rows, kv8 = job
            kv, i64 = (torch.float8_e4m3fn if kv8 else bf), torch.int64
            s_qkv, s_kb, s_kh = (NH + 2 * NKV) * HD, NKV * ATTN_CTX * HD, ATTN_CTX * HD
            common = dict(NH=NH, NKV=NKV, HD=HD, BLOCK_D=HD, grid=(1,))
            if rows == 1:
                kernels._rope_store_kernel.warmup(bf, bf, bf, i64, i64, bf, kv, kv, s_qkv, HD, NH * HD, HD, s_kb, s_kh,
                                                  HD, HAS_SLOT=False, num_warps=1, **common)
            else:
                kernels._rope_store_rows_kernel.warmup(bf, bf, bf, i64, i64, bf, kv, kv, 4096, s_qkv, HD, NH * HD, HD,
                                                       s_kb, s_kh, HD, ROWS=rows, num_warps=4, **common)
        else:
            kernels._attn_reduce_kernel.warmup(f32, f32, f32, bf, NH * HD, 2, NH=NH, HD=HD, BLOCK_S=job[1],
                                               BLOCK_D=HD, num_warps=1, grid=(1,))
    except Exception as exc:
        rec["error"] = repr(exc)[:400]
        return rec
    rec["s"] = round(time.perf_counter() - t, 3)
    return rec


# -- the GEMM cases -----------------------------------------------------------------------------------------

class MmCase(G.Case):
    """gemv_bench's Case (x, rotating weights, float64 reference, timed configs) launching ``mm_gemm``."""

    bug = ""

    def launch(self, x: torch.Tensor, w: torch.Tensor, c: MmCfg) -> torch.Tensor:
        return kernels.mm_gemm(x, w, c, nt_short=int(self.bug == "skip_k_tile"))


def mm_row(cs: MmCase, reps: int, margin: float) -> dict:
    """Finals of one case: its best 3 at full length, cuBLAS (F.linear) graph and eager, GB/s, % ceiling."""
    fin = {c: cs.time_cfg(c, reps) for c in cs.best(3)}
    fin = {c: t for c, t in fin.items() if math.isfinite(t)}
    best = min(fin, key=fin.get) if fin else None
    wb = cs.n * cs.k * 2
    row = {"shape": cs.name, "N": cs.n, "K": cs.k, "M": cs.m, "weight_mb": wb / 1e6, "configs_timed": len(cs.timed),
           "configs_stage1": cs.planned, "n_failed": len(cs.failed), "failed": cs.failed[:5],
           "best_cfg": list(astuple(best)) if best else None, "best_label": best.label() if best else "-",
           "finalists_us": {c.label(): t for c, t in fin.items()}}
    forms = {"cublas": lambda x, w: F.linear(x, w)}
    if best is not None:
        forms["triton"] = lambda x, w, c=best: cs.launch(x, w, c)
    for f, fn in forms.items():
        row[f"{f}_err"] = (fn(cs.x, cs.ws[0]).double() - cs.ref).abs().max().item()
        row[f"{f}_graph_us"] = G.graph_us(cs.calls(fn), reps)
        row[f"{f}_eager_us"] = G.eager_us(cs.calls(fn), 30)
        row[f"{f}_gbs"] = wb / row[f"{f}_graph_us"] / 1e3
        row[f"{f}_pct"] = 100.0 * row[f"{f}_gbs"] / CEILING_GBS
    row["speedup"] = row["cublas_graph_us"] / row.get("triton_graph_us", math.inf)  # > 1: Triton faster
    row["winner"] = "triton" if row["speedup"] > 1.0 + margin else "cublas"
    return row


def mm_table(rows: list[dict]) -> tuple[dict, str]:
    """MM_CONFIGS (key -> config tuple) of the winners, and its ready-to-paste Python text."""
    cfgs, lines = {}, ["MM_CONFIGS = {"]
    for r in rows:
        if r["winner"] == "triton":
            key = (kernels.mm_rows(r["M"]), r["N"], r["K"])
            cfgs[str(key)] = r["best_cfg"]
            bn, bk, w, st, sk, sw, ev = r["best_cfg"]
            lines.append(f"    {key}: MmCfg({bn}, {bk}, {w}, {st}, {sk}, {sw}, {ev!r}),  # {r['shape']:7} "
                         f"{r['triton_graph_us']:.1f} vs {r['cublas_graph_us']:.1f} us")
    lines.append("}")
    return cfgs, "\n".join(lines)


class GluCase(MmCase):
    """gate/up + SwiGLU (--mm-glu): ``launch`` is the one GLU launch; ``today`` the two launches the engine runs
    without it (kernels.mm_linear: MM_CONFIGS' skinny GEMM or cuBLAS, then silu_mul); the reference is SwiGLU of
    the float64 GEMM, and the tolerance comes from today's own error against it."""

    def __init__(self, name: str, n: int, k: int, m: int, ws: list[torch.Tensor], gen: torch.Generator) -> None:
        super().__init__(name, n, k, m, ws, gen)
        self.inter = n // 2
        self.ref = F.silu(self.ref[:, :self.inter]) * self.ref[:, self.inter:]
        self.err_cublas = (self.today(self.x, ws[0]).double() - self.ref).abs().max().item()

    def today(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return kernels.silu_mul(kernels.mm_linear(x, w), self.inter)

    def launch(self, x: torch.Tensor, w: torch.Tensor, c: MmCfg) -> torch.Tensor:
        return kernels.mm_gemm(x, w, c, nt_short=int(self.bug == "skip_k_tile"), glu=self.inter)


def glu_row(cs: GluCase, reps: int, margin: float, layers: int = LAYERS) -> dict:
    """Finals of one GLU case: its best 3 at full length against today's two launches, in graphs (L2 cold):
    :func:`fuse_row`'s, its fused time and winner named for the GLU launch."""
    row = fuse_row(cs, reps, margin, layers)
    row.pop("kind")
    row["glu_us"] = row.pop("fused_us")
    row["winner"] = "glu" if row["winner"] == "fused" else "today"
    return row


def glu_table(rows: list[dict]) -> str:
    """hfkernels.MM_GLU_CONFIGS of the winners, ready to paste."""
    lines = ["MM_GLU_CONFIGS = {"]
    for r in rows:
        if r["winner"] == "glu":
            bn, bk, w, st, sk, sw, ev = r["best_cfg"]
            lines.append(f"    {(kernels.mm_rows(r['M']), r['N'], r['K'])}: MmCfg({bn}, {bk}, {w}, {st}, {sk}, {sw}, "
                         f"{ev!r}),  # {r['glu_us']:.1f} vs {r['today_us']:.1f} us (gate/up + silu_mul)")
    return "\n".join(lines + ["}"])


def glu_part(res: dict, args, cases: list[GluCase], layers: int, log, t0: float, budget: float) -> dict:
    """--glu-only: the gate/up shape's GLU launch at each M against today's two launches (the budget's 0.85)."""
    G._tune(cases, {id(cs): glu_space(cs.n, cs.k, cs.m) for cs in cases}, t0 + 0.85 * budget)
    res["glu"] = []
    for cs in cases:
        row = glu_row(cs, args.reps, args.margin, layers)
        res["glu"].append(row)
        log(f"gate/up + SwiGLU M={cs.m}: today {row['today_us']:.1f} us, GLU {row['glu_us']:.1f} us ({row['best_label']}, "
            f"{row['configs_timed']} timed, {row['n_failed']} failed): x{row['speedup']:.3f}, step gain "
            f"{row['step_gain_ms']:.3f} ms")
    res["glu_configs_py"] = glu_table(res["glu"])
    res["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


class FuseCase(MmCase):
    """A --mm-norm launch (``kind``): "norm" / "glu_norm", x the residual stream and RMSNorm(x) * ln the GEMM's input
    (in its prologue; glu_norm: the GLU launch's), or "res", ``res + x @ W.T`` written into a residual by the epilogue
    (or split-K's reduction). ``today`` is what the engine runs without --mm-norm: the GEMM (kernels.mm_linear;
    glu_norm: --mm-glu's launch, mm_glu_linear) over the normed x, or the GEMM, then add_rmsnorm (the residual add
    and the next norm in one launch: what a RES launch and the next GEMM's NORM take over between them). The
    reference is float64; the tolerance comes from today's own error against it. A step's norm launches are counted
    once, in the "res" cases (each add_rmsnorm is the residual add and the next GEMM's norm): a "norm" case's today is
    the GEMM alone over x already normed (layer 0's lone rmsnorm, ~2 us a step, is left out)."""

    def __init__(self, kind: str, name: str, n: int, k: int, m: int, ws: list[torch.Tensor], gen: torch.Generator) -> None:
        super().__init__(name, n, k, m, ws, gen)
        self.kind, self.inter = kind, n // 2
        dev = ws[0].device
        self.ln = (1.0 + 0.3 * torch.randn(k, device=dev, generator=gen)).to(torch.bfloat16)
        self.ln_n = (1.0 + 0.3 * torch.randn(n, device=dev, generator=gen)).to(torch.bfloat16)  # res: the next norm's
        if kind == "res":
            self.r = torch.randn(m, n, device=dev, generator=gen).to(torch.bfloat16)
            self.rbuf = self.r.clone()
            self.ref = self.r.double() + self.ref
        else:
            self.h = kernels.rmsnorm(self.x, self.ln, EPS)  # today's GEMM input: the norm launch is the res cases'
            xd = self.x.double()
            h = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * self.ln.double()
            self.ref = h @ ws[0].double().t()
            if kind == "glu_norm":
                self.ref = F.silu(self.ref[:, :self.inter]) * self.ref[:, self.inter:]
        self.err_cublas = (self.today(self.x, ws[0]).double() - self.ref).abs().max().item()

    def today(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.kind == "res":
            return kernels.add_rmsnorm(self.r, kernels.mm_linear(x, w), self.ln_n, EPS)[0]
        h = self.h
        if self.kind == "glu_norm":
            y = kernels.mm_glu_linear(h, w, self.inter)
            return y if y is not None else kernels.silu_mul(kernels.mm_linear(h, w), self.inter)
        return kernels.mm_linear(h, w)

    def launch(self, x: torch.Tensor, w: torch.Tensor, c: MmCfg) -> torch.Tensor:
        short = int(self.bug == "skip_k_tile")
        if self.kind == "res":
            return kernels.mm_gemm(x, w, c, nt_short=short, res=self.rbuf)
        return kernels.mm_gemm(x, w, c, nt_short=short, norm=(self.ln, EPS), glu=self.inter if self.kind == "glu_norm" else 0)

    def time_cfg(self, c: MmCfg, reps: int) -> float:
        if self.kind == "res" and c not in self.timed:
            self.rbuf.copy_(self.r)  # the checked first launch adds into the residual it was built from
        return super().time_cfg(c, reps)


def fuse_row(cs: MmCase, reps: int, margin: float, layers: int = LAYERS) -> dict:
    """Finals of one GLU or --mm-norm case: its best 3 at full length against ``today`` (the launches the fused one
    replaces), in graphs (L2 cold); the step gain counts ``layers`` calls a step (the lm_head's: one)."""
    fin = {c: cs.time_cfg(c, reps) for c in cs.best(3)}
    fin = {c: t for c, t in fin.items() if math.isfinite(t)}
    best = min(fin, key=fin.get) if fin else None
    row = {"shape": cs.name, "kind": getattr(cs, "kind", "glu"), "N": cs.n, "K": cs.k, "M": cs.m,
           "configs_timed": len(cs.timed), "n_failed": len(cs.failed), "failed": cs.failed[:5],
           "best_cfg": list(astuple(best)) if best else None, "best_label": best.label() if best else "-",
           "finalists_us": {c.label(): t for c, t in fin.items()}, "today_us": G.graph_us(cs.calls(cs.today), reps)}
    row["fused_us"] = G.graph_us(cs.calls(lambda x, w, c=best: cs.launch(x, w, c)), reps) if best else math.inf
    row["speedup"] = row["today_us"] / row["fused_us"]
    row["winner"] = "fused" if row["speedup"] > 1.0 + margin else "today"
    calls = layers if cs.name in LAYER_SHAPES else 1
    row["step_gain_ms"] = (row["today_us"] - row["fused_us"]) * calls / 1e3 if best else 0.0
    row["calls"] = calls
    if getattr(cs, "kind", "") == "res":  # what a RES launch leaves when the next GEMM's norm is not fused: a norm launch
        row["norm_us"] = G.graph_us(cs.calls(lambda x, w: kernels.rmsnorm(cs.r, cs.ln_n, EPS)), reps)
    return row


# The norm each residual add is paired with (the engine's _decode_mm_norm): O's add and ln2 (gate/up's norm, or with
# --mm-glu the GLU launch's), down's add and the next layer's ln1 (QKV's norm; the last layer's: the lm_head's).
# A RES launch without its norm fused leaves that norm as a launch of its own; an unlisted RES launch is today's
# GEMM + add_rmsnorm, the next GEMM over its normed rows (its NORM launch unused).
RES_PAIRS = {"o": (("norm", "gate_up"), ("glu_norm", "gate_up")), "down": (("norm", "qkv"), ("norm", "qkv"))}


def pair_gain(res_row: dict | None, norm_row: dict | None) -> tuple[float, bool]:
    """(the step's gain in ms, whether to list the RES launch) for a residual add and its norm: 0 (today's) if the RES
    launch lost; both fused if both won; else the RES launch with the norm launch it leaves, listed only if that
    still gains."""
    if not res_row or res_row["winner"] != "fused":
        return 0.0, False
    if norm_row and norm_row["winner"] == "fused":
        return res_row["step_gain_ms"] + max(norm_row["step_gain_ms"], 0.0), True
    alone = res_row["step_gain_ms"] - res_row.get("norm_us", 0.0) * res_row["calls"] / 1e3
    return max(alone, 0.0), alone > 0.0


def fuse_listed(rows: list[dict]) -> list[dict]:
    """The rows MM_FUSE_CONFIGS lists: the NORM/GLU winners, and the RES winners whose pair gains (O's paired with the
    GLU launch's norm where the sweep timed it: what the step scripts serve, --mm-glu on)."""
    by = {(r["kind"], r["shape"], r["M"]): r for r in rows}
    out = []
    for r in rows:
        if r["winner"] != "fused":
            continue
        if r["kind"] == "res":
            plain, glu = RES_PAIRS[r["shape"]]
            pair = glu if (*glu, r["M"]) in by else plain
            if not pair_gain(r, by.get((*pair, r["M"])))[1]:
                continue
        out.append(r)
    return out


def fuse_table(rows: list[dict]) -> str:
    """hfkernels.MM_FUSE_CONFIGS of the winners, ready to paste."""
    lines = ["MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {"]
    for r in sorted(fuse_listed(rows), key=lambda r: (r["kind"], r["shape"], r["M"])):
        bn, bk, w, st, sk, sw, ev = r["best_cfg"]
        lines.append(f"    {(r['kind'], kernels.mm_rows(r['M']), r['N'], r['K'])}: MmCfg({bn}, {bk}, {w}, {st}, {sk}, "
                     f"{sw}, {ev!r}),  # {r['shape']} {r['fused_us']:.1f} vs {r['today_us']:.1f} us")
    return "\n".join(lines + ["}"])


def fuse_steps(rows: list[dict]) -> dict:
    """Per M: the step's gain under --mm-norm (norm: qkv, gate_up, lm_head; res: o, down) and under --mm-norm with
    --mm-glu (gate/up's glu_norm instead), pair by pair (pair_gain: a RES launch counts the norm launch it leaves when
    its norm lost; a loser stays today's); the lm_head's norm counts where down's add is listed."""
    out = {}
    for m in sorted({r["M"] for r in rows}):
        by = {(r["kind"], r["shape"]): r for r in rows if r["M"] == m}
        down, down_listed = pair_gain(by.get(("res", "down")), by.get(("norm", "qkv")))
        head = by.get(("norm", "lm_head"))
        common = down + (max(head["step_gain_ms"], 0.0) if down_listed and head and head["winner"] == "fused" else 0.0)
        out[str(m)] = {"mm_norm_ms": common + pair_gain(by.get(("res", "o")), by.get(("norm", "gate_up")))[0],
                       "mm_norm_glu_ms": common + pair_gain(by.get(("res", "o")), by.get(("glu_norm", "gate_up")))[0]}
    return out


def fuse_part(res: dict, args, cases: list[FuseCase], layers: int, log, t0: float, budget: float) -> dict:
    """--fuse-only: each --mm-norm launch against today's launches (the budget's 0.85)."""
    G._tune(cases, {id(cs): fuse_space(cs.kind, cs.n, cs.k, cs.m) for cs in cases}, t0 + 0.85 * budget)
    res["fuse"] = []
    for cs in cases:
        row = fuse_row(cs, args.reps, args.margin, layers)
        res["fuse"].append(row)
        log(f"{cs.kind} {cs.name} M={cs.m}: today {row['today_us']:.1f} us, fused {row['fused_us']:.1f} us "
            f"({row['best_label']}, {row['configs_timed']} timed, {row['n_failed']} failed): x{row['speedup']:.3f}, "
            f"step gain {row['step_gain_ms']:.3f} ms"
            + (f" (a norm launch {row['norm_us']:.1f} us left where the next norm is not fused)" if "norm_us" in row else ""))
    res["fuse_step"] = fuse_steps(res["fuse"])
    res["fuse_configs_py"] = fuse_table(res["fuse"])
    res["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def step_gain(rows: list[dict], layers: int = LAYERS) -> dict:
    """Per M: the decode step's projection time (32 layers x 4 shapes + lm_head) by cuBLAS and by each
    shape's winner, from the per-call graph times (each already over rotating weights, L2 cold)."""
    out = {}
    for m in sorted({r["M"] for r in rows}):
        by = {r["shape"]: r for r in rows if r["M"] == m}
        if not set(SHAPES) <= set(by):
            continue
        def t(r, best):
            return min(r["cublas_graph_us"], r.get("triton_graph_us", math.inf)) if best else r["cublas_graph_us"]
        cub = sum(t(by[s], False) * (layers if s in LAYER_SHAPES else 1) for s in SHAPES) / 1e3
        win = sum((t(by[s], True) if by[s]["winner"] == "triton" else by[s]["cublas_graph_us"])
                  * (layers if s in LAYER_SHAPES else 1) for s in SHAPES) / 1e3
        out[str(m)] = {"cublas_ms": cub, "best_of_ms": win, "gain_ms": cub - win}
    return out


# -- the attention sweep ------------------------------------------------------------------------------------

class AttnCase(G.Case):
    """decode_attn at batch B as a gemv_bench Case: its "weights" are the ATTN_LAYERS layers of a K/V pool
    (a graph's calls take them in turn), its reference decode_attn_ref in float64 on layer 0."""

    def __init__(self, B: int, device: str, gen: torch.Generator, kv: str = "bf16") -> None:
        self.name, self.n, self.k, self.m, self.ws = f"attn B={B} {kv}", B, ATTN_CTX, B, list(range(ATTN_LAYERS))
        shape = (ATTN_LAYERS, B, NKV, ATTN_CTX, HD)
        dt = KV_DTYPES[kv]
        self.Kp, self.Vp = (torch.randn(shape, device=device, generator=gen).to(torch.bfloat16).to(dt) for _ in range(2))
        self.x = torch.randn(B, NH, HD, device=device, generator=gen).to(torch.bfloat16)  # q
        self.pos = torch.randint(POS_LO, POS_HI + 1, (B,), device=device, generator=gen)
        self.scale = HD ** -0.5
        self.ref = kernels.decode_attn_ref(self.x.double(), self.Kp[:1].double(), self.Vp[:1].double(), 0, B,
                                           self.pos, ATTN_CTX, self.scale)
        got = kernels.decode_attn_ref(self.x, self.Kp, self.Vp, 0, B, self.pos, ATTN_CTX, self.scale)
        self.err_cublas = (got.double() - self.ref).abs().max().item()  # torch's own error plays cuBLAS's
        self.kv_bytes = int((self.pos + 1).sum().item()) * NKV * HD * 2 * self.Kp.element_size()
        self.timed, self.failed, self.planned = {}, [], 0

    def launch(self, q: torch.Tensor, layer: int, c: AttnCfg) -> torch.Tensor:
        return kernels.decode_attn(q, self.Kp, self.Vp, layer, self.n, self.pos, ATTN_CTX, self.scale, cfg=c)


def attn_sweep(B: int, until: float, reps: int, device: str, gen: torch.Generator, log, kv: str = "bf16") -> dict:
    """Every attn_space config at batch B (graphs of CALLS calls over the layers in turn) over a ``kv`` pool,
    each checked against decode_attn_ref first; today's launch first, then the rest until ``until``, the best
    3 and today's timed again at full length."""
    cs = AttnCase(B, device, gen, kv)
    today = AttnCfg()
    cs.time_cfg(today, 3)
    space_b = attn_space(B, kv == "fp8")
    G._tune([cs], {id(cs): [c for c in space_b if c != today]}, until)
    fin = {c: cs.time_cfg(c, reps) for c in dict.fromkeys([today, *cs.best(3)])}
    best = min(fin, key=fin.get)
    timed, failed, kv_bytes = cs.timed, cs.failed, cs.kv_bytes
    pos = cs.pos
    row = {"B": B, "kv": kv, "ctx": ATTN_CTX, "pos_mean": float(pos.double().mean()), "kv_mb": kv_bytes / 1e6,
           "timed": len(timed), "planned": len(space_b), "n_failed": len(failed), "failed": failed[:5],
           "today_splits": attn_splits(today, B), "today_us": fin[today], "best_label": best.label(),
           "best_cfg": list(astuple(best)), "best_splits": attn_splits(best, B), "best_us": fin[best],
           "finalists_us": {c.label(): t for c, t in fin.items()}}
    for k in ("today", "best"):
        row[f"{k}_gbs"] = kv_bytes / row[f"{k}_us"] / 1e3
        row[f"{k}_pct"] = 100.0 * row[f"{k}_gbs"] / CEILING_GBS
    row["speedup"] = row["today_us"] / row["best_us"]
    row["step_gain_ms"] = (row["today_us"] - row["best_us"]) * LAYERS / 1e3
    log(f"attention B={B} {kv}: today ({today.label()}, {row['today_splits']} splits) {row['today_us']:.1f} us "
        f"{row['today_gbs']:.0f} GB/s; best {best.label()} {row['best_us']:.1f} us {row['best_gbs']:.0f} GB/s "
        f"({row['timed']}/{row['planned']} timed, {row['n_failed']} failed)")
    return row


# -- the GPU run ---------------------------------------------------------------------------------------------

def stage1_jobs(shapes: dict, attn_bs=ATTN_BS, kvs=("bf16",), glu: bool = False, fuse: bool = False) -> list[tuple]:
    """Every variant stage 1 and the attention sweep launch (the GEMM's for each M, the attention's per batch
    and KV pool dtype); no GEMM's with ``shapes`` empty (--attn-only); with ``glu`` (--glu-only) the GLU space's
    at the gate/up shape instead, and no attention's; with ``fuse`` (--fuse-only) the --mm-norm launches' spaces."""
    if fuse:
        return sorted({variant(c, m, kind=kind) for m in FUSE_MS for kind, name in FUSE_SHAPES
                       for c in fuse_space(kind, *shapes[name], m)}, key=str)
    if glu:
        n, k = shapes["gate_up"]
        return sorted({variant(c, m, glu=True) for m in MS for c in glu_space(n, k, m)}, key=str)
    jobs = sorted({variant(c, m) for m in MS for n, k in shapes.values() for c in space(n, k, m)}, key=str)
    attn = set().union(*(attn_variants(B, kv == "fp8") for B in attn_bs for kv in kvs)) if attn_bs else set()
    return jobs + sorted(attn, key=str)


def compile_only(args) -> int:
    """Compile stage 1's variants for sm_90 in ``--jobs`` processes (the GPU run's pool), no GPU needed:
    a compile error, or more shared memory than an SM has, is a problem. With --glu-only or --fuse-only, that
    sweep's variants."""
    jobs = stage1_jobs(SHAPES, glu=getattr(args, "glu_only", False), fuse=getattr(args, "fuse_only", False))
    t = time.perf_counter()
    recs = G.wait_compiled(*G.precompile(jobs, 4096, 4096, 90, args.jobs, inspect=True, job_fn=_compile))
    bad = [r for r in recs if "error" in r or r.get("shared", 0) > G.SMEM_MAX]
    for r in bad:
        print("PROBLEM", r)
    mm = [r for r in recs if r.get("job", [""])[0] == "mm" and "error" not in r]
    print(json.dumps({"variants": len(recs), "clean": len(recs) - len(bad), "wall_s": round(time.perf_counter() - t, 1),
                      "mm_wgmma": sum(bool(r.get("wgmma")) for r in mm), "mm": len(mm)}))
    print(f"{len(recs) - len(bad)} of {len(recs)} variants compile for sm_90 cleanly")
    return 1 if bad else 0


def gpu(args, device: str = "cuda", shapes: dict | None = None, layers: int = LAYERS, attn_bs=ATTN_BS) -> dict:
    """The H200 run (``device``, ``shapes``, ``layers`` and ``attn_bs`` are for the CPU test of this flow)."""
    t0 = time.perf_counter()
    attn_only, glu_only = getattr(args, "attn_only", False), getattr(args, "glu_only", False)
    fuse_only = getattr(args, "fuse_only", False)
    kvs = tuple(getattr(args, "kv", None) or ("bf16",))
    shapes = {} if attn_only else shapes or SHAPES
    budget = args.budget_s

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:5.1f}s] {msg}", flush=True)

    res: dict = {"meta": {"triton": triton.__version__, "torch": torch.__version__, "calls_per_graph": CALLS,
                          "reps": args.reps, "budget_s": budget, "ceiling_gbs": CEILING_GBS, "margin": args.margin},
                 "pool": {}, "cases": [], "attention": []}
    jobs1 = stage1_jobs(shapes, attn_bs, kvs, glu=glu_only, fuse=fuse_only)
    pool, futs = G.precompile(jobs1, 4096, 4096, 90, args.jobs, job_fn=_compile) if device == "cuda" else (None, [])
    gen = torch.Generator(device=device).manual_seed(0)
    if device == "cuda":
        dev = torch.cuda.get_device_properties(0)
        res["meta"].update(device=dev.name, sms=dev.multi_processor_count)
    swept = {"gate_up": shapes["gate_up"]} if glu_only else shapes  # --glu-only: gate/up's GLU cases alone
    weights = {name: [(torch.randn(n, k, device=device, generator=gen) * k ** -0.5).to(torch.bfloat16)
                      for _ in range(layers if name in LAYER_SHAPES else 2)] for name, (n, k) in swept.items()}
    if fuse_only:  # the --mm-norm launches: each kind at its shapes, at FUSE_MS
        cases = [FuseCase(kind, name, *shapes[name], m, weights[name], gen) for m in FUSE_MS for kind, name in FUSE_SHAPES]
    else:
        case = GluCase if glu_only else MmCase
        cases = [case(name, n, k, m, weights[name], gen) for name, (n, k) in swept.items() for m in MS]
    log(f"weights and references ready; waiting for {len(jobs1)} stage-1 compiles (GEMM and attention)")
    recs = G.wait_compiled(None, futs)
    res["pool"]["stage1"] = {"variants": len(jobs1), "errors": [r for r in recs if "error" in r][:5],
                             "s": round(time.perf_counter() - t0, 1)}
    log(f"stage 1: {len(jobs1)} variants compiled, {len(res['pool']['stage1']['errors'])} errors")

    if attn_only or glu_only or fuse_only:  # the whole budget to the attention sweeps, the GLU or the fused launches
        if pool is not None:
            pool.shutdown()
        if fuse_only:
            return fuse_part(res, args, cases, layers, log, t0, budget)
        if glu_only:
            return glu_part(res, args, cases, layers, log, t0, budget)
        return attn_part(res, args, attn_bs, kvs, device, gen, log, t0, budget)
    G._tune(cases, {id(cs): space(cs.n, cs.k, cs.m) for cs in cases}, t0 + 0.45 * budget)
    for cs in cases:
        cs.planned = len(space(cs.n, cs.k, cs.m))
        b = cs.best(1)
        log(f"{cs.name} M={cs.m}: stage 1 timed {len(cs.timed)}/{cs.planned}, best "
            f"{f'{b[0].label()} {cs.timed[b[0]]:.1f} us' if b else '-'}, {len(cs.failed)} failed")
    around = {id(cs): space(cs.n, cs.k, cs.m, 2, cs.best(2)) for cs in cases}
    jobs2 = sorted({variant(c, cs.m) for cs in cases for c in around[id(cs)]} - set(jobs1), key=str)
    t = time.perf_counter()
    if device == "cuda" and pool is not None:
        recs = G.wait_compiled(None, [pool.submit(_compile, j, 4096, 4096, 90) for j in jobs2])
    res["pool"]["stage2"] = {"variants": len(jobs2), "errors": [r for r in recs if "error" in r][:5],
                             "s": round(time.perf_counter() - t, 1)}
    if pool is not None:
        pool.shutdown()
    log(f"stage 2: {len(jobs2)} more variants compiled")
    G._tune(cases, around, t0 + 0.65 * budget)
    log("stage 2 timed; finals")
    for cs in cases:
        row = mm_row(cs, args.reps, args.margin)
        res["cases"].append(row)
        log(f"{cs.name} M={cs.m}: cuBLAS {row['cublas_graph_us']:.1f} us ({row['cublas_pct']:.0f}%), triton "
            f"{row.get('triton_graph_us', math.inf):.1f} us ({row.get('triton_pct', 0):.0f}%, {row['best_label']})")
    res["mm_configs"], res["mm_configs_py"] = mm_table(res["cases"])
    res["step"] = step_gain(res["cases"], layers)
    return attn_part(res, args, attn_bs, kvs, device, gen, log, t0, budget)


def attn_part(res: dict, args, attn_bs, kvs, device: str, gen, log, t0: float, budget: float) -> dict:
    """The attention sweeps: the rest of the budget, split evenly over the (batch, KV dtype) pairs."""
    pairs = [(B, kv) for B in attn_bs for kv in kvs]
    for i, (B, kv) in enumerate(pairs):
        until = time.perf_counter() + max(t0 + 0.92 * budget - time.perf_counter(), 2.0) / (len(pairs) - i)
        res["attention"].append(attn_sweep(B, until, args.reps, device, gen, log, kv))
    res["attn_configs_py"] = attn_table(res["attention"], args.margin)
    res["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def attn_table(rows: list[dict], margin: float) -> str:
    """hfkernels' table entries of the winners by more than ``margin``: ATTN_CONFIGS (a bf16 pool) and
    ATTN_LOWP_FP8 (an fp8 pool's, when swept)."""
    out = []
    for kv, name in (("bf16", "ATTN_CONFIGS"), ("fp8", "ATTN_LOWP_FP8")):
        part = [r for r in rows if r.get("kv", "bf16") == kv]
        if part or kv == "bf16":
            out.append(_attn_entries(part, margin, name))
    return "\n".join(out)


def _attn_entries(rows: list[dict], margin: float, name: str) -> str:
    lines = [f"{name} = {{"]
    for r in rows:
        s, bn, w, st, lp, reg = r["best_cfg"]
        if r["speedup"] > 1.0 + margin and (lp or name == "ATTN_CONFIGS"):  # ATTN_LOWP_FP8 serves --decode-attn lowp*
            lines.append(f"    ({r['B']}, {r['ctx']}): AttnCfg({s}, {bn}, {w}, {st}, {lp}{', reg=True' if reg else ''}),"
                         f"  # {r.get('kv', 'bf16')} pool: {r['best_us']:.1f} vs {r['today_us']:.1f} us")
    return "\n".join(lines + ["}"])


def table(res: dict) -> str:
    lines = [f"{'shape':8} {'M':>2} {'MB':>6} | {'cuBLAS us':>9} {'GB/s':>5} {'%ceil':>5} | {'triton us':>9} "
             f"{'GB/s':>5} {'%ceil':>5} {'speedup':>7} | {'eager cuBLAS/triton':>19} | winner  best (timed/grid, failed)"]
    for r in res["cases"]:
        f = functools.partial(G.cell, r)
        lines.append(f"{r['shape']:8} {r['M']:>2} {r['weight_mb']:6.1f} | {f('cublas_graph_us', '9.1f')} "
                     f"{f('cublas_gbs', '5.0f')} {f('cublas_pct', '5.1f')} | {f('triton_graph_us', '9.1f'):>9} "
                     f"{f('triton_gbs', '5.0f'):>5} {f('triton_pct', '5.1f'):>5} {r['speedup']:7.3f} | "
                     f"{f('cublas_eager_us', '8.1f')} / {f('triton_eager_us', '8.1f'):>8} | {r['winner']:7} "
                     f"{r['best_label']} ({r['configs_timed']}/{r['configs_stage1']}, {r['n_failed']})")
    for m, s in res.get("step", {}).items():
        lines.append(f"M={m}: projections per decode step (32 layers + lm_head) cuBLAS {s['cublas_ms']:.3f} ms, "
                     f"with the winners {s['best_of_ms']:.3f} ms: gain {s['gain_ms']:.3f} ms")
    for r in res.get("attention", []):
        lines.append(f"attention B={r['B']} {r.get('kv', 'bf16')} ctx {r['ctx']} (pos mean {r['pos_mean']:.0f}, {r['kv_mb']:.0f} MB K/V): "
                     f"today {r['today_us']:.1f} us {r['today_gbs']:.0f} GB/s ({r['today_pct']:.0f}%), best "
                     f"{r['best_label']} ({r['best_splits']} splits) {r['best_us']:.1f} us {r['best_gbs']:.0f} GB/s "
                     f"({r['best_pct']:.0f}%): x{r['speedup']:.3f}, step gain {r['step_gain_ms']:.3f} ms")
    for r in res.get("glu", []):
        lines.append(f"gate/up + SwiGLU M={r['M']}: today (mm_linear + silu_mul) {r['today_us']:.1f} us, one GLU launch "
                     f"{r['glu_us']:.1f} us ({r['best_label']}): x{r['speedup']:.3f}, step gain {r['step_gain_ms']:.3f} ms")
    for r in res.get("fuse", []):
        lines.append(f"--mm-norm {r['kind']} {r['shape']} M={r['M']}: today {r['today_us']:.1f} us, fused {r['fused_us']:.1f} "
                     f"us ({r['best_label']}): x{r['speedup']:.3f}, step gain {r['step_gain_ms']:.3f} ms"
                     + (f", {r['norm_us']:.1f} us of norm left unpaired" if "norm_us" in r else ""))
    for m, st in res.get("fuse_step", {}).items():
        lines.append(f"M={m}: --mm-norm saves {st['mm_norm_ms']:.3f} ms a step (pair by pair), with --mm-glu "
                     f"{st['mm_norm_glu_ms']:.3f} ms against --mm-glu alone")
    lines += [res.get("mm_configs_py", ""), res.get("attn_configs_py", ""), res.get("glu_configs_py", ""),
              res.get("fuse_configs_py", "")]
    return "\n".join(lines)


# -- the CPU smoke run ----------------------------------------------------------------------------------------

def smoke(bug: str = "", shapes: dict | None = None, cfgs=SMOKE_CFGS, attn_cfgs=SMOKE_ATTN) -> dict:
    """Interpreted on the CPU: every mm cfg at every tiny shape and M against the float64 x @ W.T, and every
    attention cfg against the float64 decode_attn_ref (gemv_bench's ``check``; torch's CPU bf16 result plays
    cuBLAS). ``bug``: skip_k_tile (the GEMM one K tile short), attn_short (attention one position short)."""
    assert bug in BUGS
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, n, k, m, x, w, ref, err_c in G.smoke_cases(shapes or SMOKE_SHAPES, g):
        for c in cfgs:
            y = kernels.mm_gemm(x, w, c, nt_short=int(bug == "skip_k_tile"))
            rows.append({"what": f"mm {name} N={n} K={k} M={m}", "cfg": c.label(), **G.check(y, ref, err_c)})
    B, nh, nkv, hd, ctx = 3, 4, 2, 16, 64
    Kp, Vp = (torch.randn(2, B, nkv, ctx + 16, hd, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(B, nh, hd, generator=g).to(torch.bfloat16)
    pos = torch.tensor([5, 33, 63])
    ref = kernels.decode_attn_ref(q.double(), Kp.double(), Vp.double(), 1, B, pos, ctx, hd ** -0.5)
    err_r = (kernels.decode_attn_ref(q, Kp, Vp, 1, B, pos, ctx, hd ** -0.5).double() - ref).abs().max().item()
    for c in attn_cfgs:
        o = kernels.decode_attn(q, Kp, Vp, 1, B, pos - int(bug == "attn_short"), ctx, hd ** -0.5, cfg=c)
        rows.append({"what": f"attn B={B} ctx={ctx}", "cfg": c.label(), **G.check(o, ref, err_r)})
    return {"ok": all(r["ok"] for r in rows), "bug": bug, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = G.bench_parser(__doc__, 110.0, "rough wall budget of tuning and sweep (GPU)")
    ap.add_argument("--margin", type=float, default=0.01, help="a winner must beat the baseline by this fraction")
    ap.add_argument("--jobs", type=int, default=0, help="compile processes (0: min(16, cpus))")
    ap.add_argument("--bug", choices=BUGS, default="", help="smoke: inject a deliberate kernel error")
    ap.add_argument("--compile-only", action="store_true", help="compile stage 1's variants for sm_90, no GPU")
    ap.add_argument("--attn-only", action="store_true", help="GPU: the attention sweeps only (the whole budget)")
    ap.add_argument("--glu-only", action="store_true", help="GPU: gate/up + SwiGLU as one launch (--mm-glu) against "
                    "today's two, per row bucket (the whole budget); prints MM_GLU_CONFIGS")
    ap.add_argument("--fuse-only", action="store_true", help="GPU: --mm-norm's launches (the norm in the GEMM's "
                    "prologue, the residual add in its epilogue) against today's, at 16 and 64 rows; prints MM_FUSE_CONFIGS")
    ap.add_argument("--kv", default="bf16", help="GPU: the attention sweeps' KV pool dtypes, comma-separated: bf16, fp8")
    args = ap.parse_args(argv)
    args.kv = [k.strip() for k in args.kv.split(",") if k.strip()]
    if bad := [k for k in args.kv if k not in KV_DTYPES]:
        ap.error(f"--kv {','.join(bad)}: choose from {', '.join(KV_DTYPES)}")
    if args.compile_only:
        return compile_only(args)
    return G.run(args, _smoke_run, lambda r: f"{r['what']:28} {r['cfg']:18}", gpu, table, json_default=str)


def _smoke_run(bug: str) -> dict:
    G.smoke_setup()
    return smoke(bug)


if __name__ == "__main__":
    sys.exit(main())
