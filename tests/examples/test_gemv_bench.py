"""benchmarks/gpu/gemv_bench.py on the CPU: its Triton GEMV against x @ W.T (interpreter), both ways.

The same check the H200 run applies to every config it times (max |y - float64 ref| within
max(2 x cuBLAS's error, 2**-6 x max |ref|) here, 2**-7 there) passes the kernel at ragged and even tiny
shapes and every M, and fails each deliberately wrong launch (a K tile skipped, the last N block or K split never run).
The GPU run's control flow (stage 1, stage 2, finals, the 32-layer sequence, the table) runs here with
the timing stubbed, dropping a config whose output is wrong. And the heaviest kernel variants compile
for sm_90 with Triton's own ptxas, without spills (the full space: ``--compile-only``, in the report).
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

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton", reason="triton is not installed: the kernels cannot run, even interpreted")

from triton_interp import interpreting, tree_env  # noqa: E402  (tests/hfserve)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gemv_bench.py"


def _load():
    """Import the script with TRITON_INTERPRET=1 (read when @triton.jit runs), then restore the env."""
    with interpreting():
        spec = importlib.util.spec_from_file_location("gemv_bench_interpreted", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
        return mod


G = _load()


@pytest.fixture(autouse=True, scope="module")
def _interpret():
    """The interpreter reads TRITON_INTERPRET at each launch too; keep it set only for this module."""
    with interpreting():
        yield


SPLIT_CFGS = (G.Cfg(16, 64, 2, 3, 2, False, "evict_first"), G.Cfg(8, 32, 1, 2, 4))


def test_smoke_cli_passes(tmp_path) -> None:
    """``--device cpu``: every smoke config (split-K 1/2/4, deferred and per-tile reductions, stages, evict)
    at an even and a ragged shape, M = 1..4, agrees with the float64 x @ W.T; rc 0 and the JSON."""
    assert G.main(["--device", "cpu", "--out", str(tmp_path / "s.json")]) == 0
    res = json.loads((tmp_path / "s.json").read_text())
    assert res["ok"] and len(res["rows"]) == 16 and {r["M"] for r in res["rows"]} == {1, 2, 3, 4}
    assert {r["cfg"] for r in res["rows"]} == {c.label() for c in G.SMOKE_CFGS}


@pytest.mark.parametrize("bug", [b for b in G.BUGS if b])
def test_smoke_catches_a_wrong_kernel(bug) -> None:
    """The same check fails each deliberately wrong launch, at every config (split 2 and 4, M=3, ragged)."""
    res = G.smoke(bug, shapes={"ragged": (40, 320, (3,))}, cfgs=SPLIT_CFGS)
    assert len(res["rows"]) == 2 and not any(r["ok"] for r in res["rows"])
    ok = G.smoke("", shapes={"ragged": (40, 320, (3,))}, cfgs=SPLIT_CFGS)  # and the same cases pass unbugged
    assert ok["ok"]


def test_gpu_flow_on_the_cpu(monkeypatch) -> None:
    """``gpu()`` end to end on tiny shapes, interpreted, timing stubbed (seeded random times): stage 1 and 2,
    the finals with every cuBLAS form, the layer sequence and the table. A config made to compute the
    wrong answer (a K tile skipped) is checked, counted as failed and never chosen."""
    rng = random.Random(0)
    monkeypatch.setattr(G, "graph_us", lambda calls, reps: rng.uniform(5, 10))
    monkeypatch.setattr(G, "eager_us", lambda calls, reps: rng.uniform(20, 30))
    bad = G.Cfg(16, 64, 2, 1, 1)
    good = [G.Cfg(16, 64, 2, 2, 1), G.Cfg(16, 64, 2, 1, 2)]
    monkeypatch.setattr(G, "space", lambda n, k, m, stage=1, around=None: [bad, *good] if stage == 1 else
                        [G.replace(c, evict="evict_first") for c in around or []])
    gemv = G.gemv
    monkeypatch.setattr(G, "gemv", lambda x, w, c, bug="": gemv(x, w, c, "skip_k_tile" if c == bad else bug))
    shapes = {"qkv": (48, 128), "o": (32, 64), "gate_up": (64, 64), "down": (32, 128), "lm_head": (40, 64)}
    args = argparse.Namespace(reps=3, budget_s=1e6, jobs=1)
    res = G.gpu(args, device="cpu", shapes=shapes, layers=2)
    assert len(res["cases"]) == 15
    for r in res["cases"]:
        assert r["n_failed"] == 1 and r["failed"][0].startswith(bad.label())
        assert r["best_label"] != bad.label() and r["configs_timed"] == 5  # 3 in stage 1, 2 evict variants
        assert {"linear_graph_us", "matmul_graph_us", "triton_graph_us", "triton_eager_us"} <= r.keys()
        assert ("mv_graph_us" in r) == (r["M"] == 1) and r["triton_err"] <= r["tol"]
    lay = res["layer"]
    assert lay["layers"] == 2 and set(lay["cfgs"]) == set(G.LAYER_SHAPES) and "step_gain_ms" in lay
    assert G.table(res).count("\n") == 16


def test_heaviest_variants_compile_for_the_h200() -> None:
    """``--compile-only --limit 6``: the six heaviest kernel variants of the space (most accumulator
    registers per thread, deepest pipelines) compile for sm_90 through the JIT's own warm-up path (the
    GPU run's worker processes do the same), with Triton's ptxas: no spills, shared memory within an SM, cp.async where
    STAGES > 1. Compiled, not interpreted: a subprocess."""
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("triton without its NVIDIA backend's ptxas")
    env = tree_env({k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    res = subprocess.run([sys.executable, str(SCRIPT), "--compile-only", "--limit", "6", "--jobs", "1"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "6 of 6 variants compile for sm_90 cleanly" in res.stdout
