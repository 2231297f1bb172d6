"""benchmarks/gpu/mm_bench.py on the CPU: its skinny GEMM and attention checks, both ways, and its GPU control flow.

The smoke run (interpreter, tiny shapes) checks every GEMM config against the float64 x @ W.T and every
attention config against the float64 decode_attn_ref with gemv_bench's ``check``, and fails a deliberately
wrong kernel (``--bug skip_k_tile``: the GEMM one K tile short; ``attn_short``: attention one position short).
The GPU run's flow (stage 1, stage 2, finals, the MM_CONFIGS table, the step estimate, the attention sweep)
runs here with the timing stubbed, dropping a config whose output is wrong. And the heaviest variants
compile for sm_90 through the bench's own ahead-of-time path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from triton_interp import patch_kernels, tree_env  # tests/hfserve

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton", reason="triton is not installed: the kernels cannot run, even interpreted")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "mm_bench.py"


def _load():
    """Import the script with TRITON_INTERPRET=1 (read when @triton.jit runs), then restore the env."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec = importlib.util.spec_from_file_location("mm_bench_interpreted", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


M = _load()


@pytest.fixture(autouse=True, scope="module")
def _interpret():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        M.G.smoke_setup()
        yield


def test_smoke_cli_passes(tmp_path) -> None:
    """``--device cpu``: 3 GEMM configs (split-K 1/2/4, both dot orientations) at an even and a ragged
    shape (M 16, 64, 20) and 5 attention configs (today's, unsplit, 3 and 2 splits, bf16 dots unsplit and split)
    pass; rc 0, the JSON."""
    assert M.main(["--device", "cpu", "--out", str(tmp_path / "s.json")]) == 0
    res = json.loads((tmp_path / "s.json").read_text())
    assert res["ok"] and len(res["rows"]) == 14 and sum(r["what"].startswith("attn") for r in res["rows"]) == 5


@pytest.mark.parametrize("bug", ["skip_k_tile", "attn_short"])
def test_smoke_catches_a_wrong_kernel(bug) -> None:
    """The bench's check fails every GEMM launch one K tile short, and every attention launch one position
    short; the rest still pass, and the CLI's rc is 1."""
    res = M.smoke(bug)
    kind = "mm" if bug == "skip_k_tile" else "attn"
    assert not res["ok"]
    assert all(r["ok"] != r["what"].startswith(kind) for r in res["rows"]), [(r["what"], r["ok"]) for r in res["rows"]]
    assert M.main(["--device", "cpu", "--bug", bug]) == 1


def _tiny_attention(monkeypatch, rng: random.Random, cfgs: list, bad) -> None:
    """gpu()'s attention sweep on the CPU: seeded random times, ``cfgs`` as the space, ``bad`` made wrong (one
    position short), the shapes shrunk to 4 q / 2 kv heads of 16 over a 64-column bucket."""
    monkeypatch.setattr(M.G, "graph_us", lambda calls, reps: rng.uniform(5, 10))
    monkeypatch.setattr(M.G, "eager_us", lambda calls, reps: rng.uniform(20, 30))
    monkeypatch.setattr(M, "attn_space", lambda B, fp8=False: cfgs)
    real_attn = M.kernels.decode_attn
    patch_kernels(monkeypatch, M.kernels, "decode_attn", lambda q, K_, V_, li, B, pos, ctx, scale, cfg=None:
                        real_attn(q, K_, V_, li, B, pos - int(cfg == bad), ctx, scale, cfg=cfg))
    for name, val in (("NH", 4), ("NKV", 2), ("HD", 16), ("ATTN_CTX", 64), ("ATTN_LAYERS", 2), ("POS_LO", 20),
                      ("POS_HI", 60)):
        monkeypatch.setattr(M, name, val)


def test_gpu_flow_on_the_cpu(monkeypatch) -> None:
    """``gpu()`` end to end on tiny shapes, interpreted, timing stubbed (seeded random times): stage 1 and 2
    (3 configs, then 2 evict variants), finals, the MM_CONFIGS table (one entry per Triton winner), the step
    estimate and the attention sweep.
    A GEMM config made wrong (one K tile short) and an attention config made wrong are failed, never chosen."""
    abad = M.AttnCfg(2, 16, 4, 2)
    _tiny_attention(monkeypatch, random.Random(0), [M.AttnCfg(1, 16, 2, 1), abad, M.AttnCfg()], abad)
    bad, good = M.MmCfg(16, 64, 4, 1), [M.MmCfg(16, 64, 4, 2), M.MmCfg(32, 32, 4, 1, 2, True)]
    monkeypatch.setattr(M, "space", lambda n, k, m, stage=1, around=None: [bad, *good] if stage == 1 else
                        [M.replace(c, evict="") for c in around or []])
    launch = M.MmCase.launch
    monkeypatch.setattr(M.MmCase, "launch", lambda self, x, w, c: launch(self, x, w, c) if c != bad else
                        M.kernels.mm_gemm(x, w, c, nt_short=1))
    shapes = {"qkv": (48, 128), "o": (32, 64), "gate_up": (64, 64), "down": (32, 128), "lm_head": (40, 64)}
    args = argparse.Namespace(reps=3, budget_s=1e6, jobs=1, margin=0.01)
    res = M.gpu(args, device="cpu", shapes=shapes, layers=2, attn_bs=(4,))
    assert len(res["cases"]) == 15
    for r in res["cases"]:
        assert r["n_failed"] == 1 and r["failed"][0].startswith(bad.label()) and r["best_label"] != bad.label()
        assert r["configs_timed"] == 5 and {"cublas_graph_us", "triton_graph_us", "triton_eager_us"} <= r.keys()
    assert set(res["step"]) == {"16", "32", "64"}
    text = M.table(res)
    assert text.count("MmCfg(") == sum(r["winner"] == "triton" for r in res["cases"]) == len(res["mm_configs"])
    (att,) = res["attention"]
    assert att["n_failed"] == 1 and att["failed"][0].startswith(abad.label()) and att["best_label"] != abad.label()
    assert att["timed"] == 3 and "attention B=4" in text


def test_attention_only_flow_over_bf16_and_fp8_pools(monkeypatch) -> None:
    """``--attn-only --kv bf16,fp8``: no GEMM case, one attention sweep per (batch, pool dtype); the fp8 pool's
    case reads half the bytes and is checked against the float64 reference over the e4m3 values; an fp8 launch
    one position short is failed there too. The CLI refuses an unknown pool dtype in one line."""
    abad = M.AttnCfg(2, 16, 4, 2, True)
    _tiny_attention(monkeypatch, random.Random(1), [M.AttnCfg(1, 16, 2, 1, True), abad, M.AttnCfg()], abad)
    assert {j[-1] for j in M.stage1_jobs({}, (4,), ("fp8",)) if j[0] == "attn"} == {True}
    args = argparse.Namespace(reps=3, budget_s=1e6, jobs=1, margin=0.01, attn_only=True, kv=["bf16", "fp8"])
    res = M.gpu(args, device="cpu", shapes={"qkv": (48, 128)}, layers=2, attn_bs=(4,))
    assert res["cases"] == [] and [(a["B"], a["kv"]) for a in res["attention"]] == [(4, "bf16"), (4, "fp8")]
    bf, f8 = res["attention"]
    assert f8["kv_mb"] == pytest.approx(bf["kv_mb"] / 2, rel=0.3)  # positions drawn per case
    for a in (bf, f8):
        assert a["n_failed"] == 1 and a["failed"][0].startswith(abad.label()) and a["timed"] == 3
    assert "attention B=4 fp8" in M.table(res)
    assert res["attn_configs_py"].startswith("ATTN_CONFIGS = {") and "\nATTN_LOWP_FP8 = {" in res["attn_configs_py"]
    with pytest.raises(SystemExit):
        M.main(["--attn-only", "--kv", "fp4"])


def test_heaviest_variants_compile_for_the_h200() -> None:
    """The heaviest GEMM variants (BLOCK_M 64 x BLOCK_N 256 accumulators, 5 stages of tiles, split-K's
    reduction) and attention variants compile for sm_90 through the bench's ahead-of-time path
    (``_compile`` with gemv_bench's ``_AOTDriver``), wgmma (warp_group_dot) where the dot's M side is 64+; the
    decode attention and the RoPE + KV store kernels over an fp8 pool (--kv-cache-dtype fp8) too. Over an fp8
    pool, bf16 dots (LOWP 1) read P @ V's operand from shared memory a byte at a time; with the tiles widened
    in registers first (LOWP 3, AttnCfg.reg) no byte is read alone and the tiles go through ldmatrix, as bf16's do.
    --mm-glu's and --mm-norm's launches (their tables' configs at 64 rows): wgmma, no spills.
    Compiled, not interpreted: a subprocess."""
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("triton without its NVIDIA backend's ptxas")
    code = """
import mm_bench as M
import json
M.kernels.load_tables("NVIDIA H200")  # the launch tables served on the H200
jobs = [("mm", 64, 256, 64, 8, 5, True, "evict_first", True), ("mm", 64, 128, 128, 4, 5, False, "", False),
        ("mm", 16, 128, 64, 4, 3, True, "evict_first", False), ("attn", True, 64, 4, 2, 1), ("attn", False, 128, 8, 4, 0),
        ("attn_red", 16), ("attn", True, 32, 2, 3, 1, True), ("attn", False, 64, 4, 2, 0, True), ("rope", 1, True),
        ("rope", 16, True), ("rope", 16, False), ("attn", True, 32, 2, 3, 3, True), ("attn", False, 32, 2, 3, 3, True),
        ("attn", False, 32, 2, 3, 1, True), ("attn", False, 32, 2, 3, 1)]
recs = [M._compile(j, 4096, 4096, 90, True) for j in jobs]
print("bytes", [r.get("byte_loads") for r in recs[-4:]], "ldmatrix", [r.get("ldmatrix") for r in recs[-4:]])
# --mm-glu's launches (hfkernels.MM_GLU_CONFIGS: gate/up + SwiGLU) at the 7B's gate/up shape
glu = [M._compile(("mm", b, c.block_n, c.block_k, c.warps, c.stages, c.swap, c.evict, False, True),
                  28672, 4096, 90, True) for (b, _, _), c in sorted(M.kernels.MM_GLU_CONFIGS.items())]
print("glu", json.dumps([{k: r.get(k) for k in ("error", "wgmma", "regs", "local", "stack")} for r in glu]))
# --mm-norm's launches at 64 rows: the norm in the prologue (QKV, gate/up with GLU, lm_head) and the residual add in the
# epilogue (O) or in split-K's reduction (down), each with its table's config where the table lists it (a sweep lists
# only the winners), else a config of the sweep's space (split-K for down's 14336)
K_ = M.kernels
DF = {"norm": K_.MmCfg(64, 128, 4, 5, 1, True, ""), "glu_norm": K_.MmCfg(64, 128, 4, 4, 1, True, "evict_first"),
      "res": K_.MmCfg(64, 128, 4, 5, 2, True, "")}
F_ = lambda kind, n, k: K_.MM_FUSE_CONFIGS.get((kind, 64, n, k), DF[kind])
fz = [(F_("norm", 6144, 4096), 6144, 4096, False, True, False),
      (F_("glu_norm", 28672, 4096), 28672, 4096, True, True, False),
      (F_("norm", 32000, 4096), 32000, 4096, False, True, False),
      (F_("res", 4096, 4096), 4096, 4096, False, False, True),
      (F_("res", 4096, 14336), 4096, 14336, False, False, True)]
fz = [M._compile(("mm", 64, c.block_n, c.block_k, c.warps, c.stages, c.swap, c.evict, c.split_k > 1, g, nm, rs), n, k, 90, True)
      for c, n, k, g, nm, rs in fz]
print("fuse", json.dumps([{k: r.get(k) for k in ("error", "wgmma", "regs", "local", "stack")} for r in fz]))
bad = [r for r in recs + glu + fz if "error" in r]
print("errors", bad)
print("wgmma", [r.get("wgmma") for r in recs[:3]])
print("compiled", len(recs) - len(bad))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env = tree_env(env, str(SCRIPT.parent))  # mm_bench beside its siblings, hfserve from its tree
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "compiled 15" in res.stdout, res.stdout[-2000:]
    nbytes, nld = (json.loads(x) for x in res.stdout.split("bytes ")[1].split("\n")[0].split(" ldmatrix "))
    # fp8 LOWP 3 split and unsplit: no byte loads; fp8 LOWP 1: byte loads; bf16 LOWP 1: none
    assert nbytes[0] == nbytes[1] == nbytes[3] == 0 < nbytes[2], res.stdout[-2000:]
    assert nld[1] == nld[3] > nld[2], res.stdout[-2000:]  # the widened fp8 tiles take bf16's ldmatrix path
    assert "wgmma [True, True, True]" in res.stdout, res.stdout[-2000:]  # SWAP: wgmma at 16 rows too
    glu = json.loads(res.stdout.split("glu ")[1].split("\n")[0])
    assert len(glu) == 3 and all(g["wgmma"] and g["local"] == g["stack"] == 0 for g in glu), glu  # no spills
    fuse = json.loads(res.stdout.split("fuse ")[1].split("\n")[0])
    assert len(fuse) == 5 and all(f["wgmma"] and f["local"] == f["stack"] == 0 for f in fuse), fuse  # --mm-norm's too


def test_glu_only_flow_on_the_cpu(monkeypatch) -> None:
    """``--glu-only``: the gate/up shape's GLU launch (gate/up + SwiGLU) at M 16/32/64 against today's two launches,
    interpreted, timing stubbed; a GLU config made wrong (one K tile short) is failed and never chosen; the
    MM_GLU_CONFIGS table has one entry per winner; its stage-1 compile jobs are all GLU variants."""
    rng = random.Random(2)
    monkeypatch.setattr(M.G, "graph_us", lambda calls, reps: rng.uniform(5, 10))
    bad, good = M.MmCfg(16, 64, 4, 1), [M.MmCfg(16, 64, 4, 2), M.MmCfg(32, 32, 4, 1, 1, True)]
    monkeypatch.setattr(M, "glu_space", lambda n, k, m: [bad, *good])
    launch = M.GluCase.launch
    monkeypatch.setattr(M.GluCase, "launch", lambda self, x, w, c: launch(self, x, w, c) if c != bad else
                        M.kernels.mm_gemm(x, w, c, nt_short=1, glu=self.inter))
    shapes = {"gate_up": (64, 64)}
    assert {j[-1] for j in M.stage1_jobs(shapes, glu=True)} == {True}
    args = argparse.Namespace(reps=3, budget_s=1e6, jobs=1, margin=0.01, glu_only=True)
    res = M.gpu(args, device="cpu", shapes=shapes, layers=2)
    assert res["cases"] == [] and [r["M"] for r in res["glu"]] == [16, 32, 64]
    for r in res["glu"]:
        assert r["n_failed"] == 1 and r["failed"][0].startswith(bad.label()) and r["best_label"] != bad.label()
        assert r["configs_timed"] == 3 and r["today_us"] > 0 and r["glu_us"] > 0
    text = M.table(res)
    assert text.count("MmCfg(") == sum(r["winner"] == "glu" for r in res["glu"]) and "MM_GLU_CONFIGS = {" in text
    assert "gate/up + SwiGLU M=64" in text


def test_fuse_only_flow_on_the_cpu(monkeypatch) -> None:
    """``--fuse-only``: --mm-norm's launches (norm and glu_norm in the prologue, res in the epilogue or split-K's
    reduction) against today's launches, interpreted, timing stubbed; a config made wrong (one K tile short) is
    failed and never chosen, for every kind; MM_FUSE_CONFIGS has one entry per winner, keyed by kind; the stage-1
    compile jobs carry the (GLU, NORM, RES) flags of each kind; the step sums count winners only."""
    rng = random.Random(3)
    monkeypatch.setattr(M.G, "graph_us", lambda calls, reps: rng.uniform(5, 10))
    monkeypatch.setattr(M, "FUSE_MS", (16,))
    bad, good = M.MmCfg(16, 64, 4, 1), [M.MmCfg(16, 64, 4, 2), M.MmCfg(32, 32, 4, 1, 1, True)]
    split = M.MmCfg(16, 32, 4, 1, 2)
    monkeypatch.setattr(M, "space", lambda n, k, m, *a, **kw: [bad, *good, split])
    monkeypatch.setattr(M, "glu_space", lambda n, k, m: [bad, *good])
    launch = M.FuseCase.launch

    def broken(self, x, w, c):
        if c != bad:
            return launch(self, x, w, c)
        self.bug = "skip_k_tile"
        try:
            return launch(self, x, w, c)
        finally:
            self.bug = ""

    monkeypatch.setattr(M.FuseCase, "launch", broken)
    shapes = {"qkv": (48, 64), "gate_up": (64, 64), "lm_head": (40, 64), "o": (64, 64), "down": (64, 128)}
    jobs = M.stage1_jobs(shapes, fuse=True)
    assert {j[-3:] for j in jobs} == {(False, True, False), (True, True, False), (False, False, True)}
    assert not [j for j in jobs if j[-2] and j[8]]  # a NORM launch is never split
    args = argparse.Namespace(reps=3, budget_s=1e6, jobs=1, margin=0.01, fuse_only=True)
    res = M.gpu(args, device="cpu", shapes=shapes, layers=2)
    assert [(r["kind"], r["shape"]) for r in res["fuse"]] == list(M.FUSE_SHAPES)
    for r in res["fuse"]:
        assert r["n_failed"] == 1 and r["failed"][0].startswith(bad.label()) and r["best_label"] != bad.label(), r
        assert r["configs_timed"] == (4 if r["kind"] == "res" else 3) and r["today_us"] > 0 and r["fused_us"] > 0
    text = M.table(res)
    listed = M.fuse_listed(res["fuse"])
    assert text.count("MmCfg(") == len(listed) and "MM_FUSE_CONFIGS: dict[tuple[str, int, int, int], MmCfg] = {" in text
    for r in listed:
        assert f"{(r['kind'], 16, r['N'], r['K'])}: MmCfg(" in text
    assert all(r["norm_us"] > 0 for r in res["fuse"] if r["kind"] == "res")  # the norm launch a RES launch may leave
    assert res["fuse_step"]["16"] == M.fuse_steps(res["fuse"])["16"]


def _row(kind: str, shape: str, today: float, fused: float, norm_us: float = 0.0, calls: int = 32) -> dict:
    return {"kind": kind, "shape": shape, "M": 64, "today_us": today, "fused_us": fused, "calls": calls,
            "winner": "fused" if today > 1.01 * fused else "today", "step_gain_ms": (today - fused) * calls / 1e3,
            "norm_us": norm_us, "N": 4096, "K": 4096, "best_cfg": [32, 128, 4, 5, 1, False, ""]}


def test_a_residual_add_fused_without_its_norm_pays_the_norm_launch() -> None:
    """The H100's batch-64 sweep (2026-12-05): O's and down's RES launches won against GEMM + add_rmsnorm (17.4 -> 15.2,
    48.3 -> 44.9 us) and every NORM launch lost, so each RES launch left a norm launch (~2.3 us) the old sums did not
    count: they said 0.18 ms a step, the server measured ~0. Pair by pair, O's RES launch gains nothing (unlisted:
    today's GEMM + add_rmsnorm), down's ~1.1 us a layer (listed); with the norms won, both pairs count in full."""
    rows = [_row("res", "o", 17.4, 15.2, 2.3), _row("res", "down", 48.3, 44.9, 2.3), _row("norm", "qkv", 20.8, 25.9),
            _row("norm", "gate_up", 85.1, 87.5), _row("glu_norm", "gate_up", 84.3, 87.6), _row("norm", "lm_head", 94.1, 95.5, calls=1)]
    assert [(r["kind"], r["shape"]) for r in M.fuse_listed(rows)] == [("res", "down")]
    step = M.fuse_steps(rows)["64"]
    assert step["mm_norm_ms"] == step["mm_norm_glu_ms"] == pytest.approx(32 * (3.4 - 2.3) / 1e3)
    won = [_row("res", "o", 17.4, 15.2, 2.3), _row("res", "down", 48.3, 44.9, 2.3), _row("norm", "qkv", 25.9, 20.8),
           _row("glu_norm", "gate_up", 87.6, 84.3), _row("norm", "lm_head", 95.5, 94.1, calls=1)]
    assert len(M.fuse_listed(won)) == 5
    assert M.fuse_steps(won)["64"]["mm_norm_glu_ms"] == pytest.approx(32 * (2.2 + 3.4 + 5.1 + 3.3) / 1e3 + 1.4 / 1e3)
    assert M.fuse_steps(won)["64"]["mm_norm_ms"] == pytest.approx(32 * (3.4 + 5.1) / 1e3 + 1.4 / 1e3)  # O's: no norm row
    lost = [_row("res", "o", 15.2, 17.4, 2.3), _row("glu_norm", "gate_up", 87.6, 84.3)]  # a lost RES launch: today's
    assert M.fuse_listed(lost) == [lost[1]] and M.fuse_steps(lost)["64"]["mm_norm_glu_ms"] == 0.0
