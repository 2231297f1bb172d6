"""benchmarks/gpu/step_table.py on a synthetic per-step profile (no GPU): the table and the plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from triton_interp import patch_kernels  # tests/hfserve

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"

import step_table  # noqa: E402

FLOORS = {"prefill_ttft_ms": 80.0, "decode_tpot_ms": 3.4, "throughput_tok_s": 13600.0}


def _part(wall: float, gemm: float, fused: float, attn: float, other: float) -> dict:
    k = {"sm90_xmma_gemm_bf16bf16_bf16f32": gemm, "void at::native::elementwise_kernel<add>": other}
    if fused:
        k["_rmsnorm_kernel"] = fused / 2
        k["_rope_store_kernel"] = fused / 2
    k["pytorch_flash::flash_fwd_kernel" if wall > 50 else "_decode_attn_split_kernel"] = attn
    return {"wall_ms": wall, "kernels_ms": k}


def _doc() -> dict:
    s1 = {"A prefill 4096": _part(114.0, 80.0, 0.0, 12.0, 20.0), "B decode b1": _part(7.1, 3.6, 0.0, 1.0, 1.8),
          "C prefill burst": _part(160.0, 130.0, 0.0, 8.0, 15.0), "C decode": _part(8.8, 4.5, 0.0, 1.5, 2.0)}
    s2 = {"A prefill 4096": _part(100.0, 80.0, 6.0, 10.0, 3.0), "B decode b1": _part(4.75, 3.6, 0.6, 0.3, 0.1),
          "C prefill burst": _part(600.0, 520.0, 20.0, 30.0, 10.0), "C decode": _part(7.0, 5.0, 0.8, 0.9, 0.1)}
    return {"floors": FLOORS, "c_shape": {"burst": 64, "output_tokens": 128},
            "steps": [{"step": 1, "knobs": {}, "batch": 16, "parts": s1}, {"step": 2, "knobs": {}, "batch": 64, "parts": s2}]}


def test_classify_and_split() -> None:
    assert step_table.classify("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn") == "gemm"
    assert step_table.classify("_rmsnorm_kernel") == "fused" and step_table.classify("_silu_mul_kernel") == "fused"
    assert step_table.classify("_decode_attn_split_kernel") == "attention"
    assert step_table.classify("_attn_reduce_kernel") == "attention"
    assert step_table.classify("pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert step_table.classify("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>") == "other"
    kinds = step_table.split(_doc()["steps"][1]["parts"]["B decode b1"]["kernels_ms"], 4.75)
    assert kinds == {"gemm": 3.6, "fused": 0.6, "attention": 0.3, "other": 0.1, "between": pytest.approx(0.15)}
    assert step_table.split({"gemm": 5.0}, 4.0)["between"] == 0.0  # never negative


def test_fractions_of_floor() -> None:
    doc = _doc()
    fr = step_table.frac_of_floor(doc["steps"][0]["parts"], FLOORS, batch=16)
    assert fr["A"] == pytest.approx(80 / 114) and fr["B"] == pytest.approx(3.4 / 7.1)
    # C modelled: 4 waves of (prefill 160 ms + 128 decode steps of 8.8 ms).
    assert fr["C"] == pytest.approx(64 * 128 / (4 * (160 + 128 * 8.8) / 1000) / 13600)
    fr2 = step_table.frac_of_floor(doc["steps"][1]["parts"], FLOORS, batch=64)
    assert fr2["C"] == pytest.approx(64 * 128 / ((600 + 128 * 7.0) / 1000) / 13600)
    assert step_table.frac_of_floor({}, FLOORS) == {"A": None, "B": None, "C": None}


def test_table_and_plot_written(tmp_path: Path) -> None:
    doc = _doc()
    prof = tmp_path / "profile_steps.json"
    prof.write_text(json.dumps(doc))
    md, svg, png = tmp_path / "steps.md", tmp_path / "steps.svg", tmp_path / "steps.png"
    step_table.main([str(prof), "--md", str(md), "--plot", str(svg)])
    lines = md.read_text().splitlines()
    assert lines[0].startswith("| step | part | wall ms | GEMM | fused | attention | other | between |")
    assert len(lines) == 2 + 8  # header, rule, 4 parts x 2 steps
    row = next(x for x in lines if x.startswith("| 2 | B decode b1 |"))
    assert "| 4.75 | 3.60 | 0.60 | 0.30 | 0.10 | 0.15 | 72% |" in row  # 3.4 / 4.75
    assert "(C, modelled)" in next(x for x in lines if x.startswith("| 1 | C decode |"))
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    step_table.write_plot(doc, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profiles_of_one_gpu_merge_by_step(tmp_path: Path, capsys) -> None:
    """Two commands' profiles (each --only some steps) make one table; a step in both: the later file's; profiles
    of two GPUs are refused with one line."""
    a, b = _doc(), _doc()
    b["steps"] = [dict(b["steps"][1], step=2, batch=99), dict(b["steps"][1], step=3)]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    md = tmp_path / "steps.md"
    step_table.main([str(pa), str(pb), "--md", str(md)])
    lines = md.read_text().splitlines()
    assert len(lines) == 2 + 12 and [x.split("|")[1].strip() for x in lines[2::4]] == ["1", "2", "3"]
    assert [s["batch"] for s in step_table.merge([a, b])["steps"]][1] == 99
    b["gpu"] = "NVIDIA H100 80GB HBM3"
    pb.write_text(json.dumps(b))
    with pytest.raises(SystemExit, match="different GPUs"):
        step_table.main([str(pa), str(pb)])


def test_steps_are_chosen_by_engine_step_number() -> None:
    """--only names engine steps, not positions in engine_steps.json (entry 6 is step 7: steps 6 and 9 have none);
    a step without an entry is refused with the ones that have one."""
    every = json.loads((GPU / "engine_steps.json").read_text())
    assert step_table.step_numbers(every) == [1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 13, 14]
    numbers, steps = step_table.select(every, "5,7,8,10")
    assert numbers == [5, 7, 8, 10]
    assert [s["rationale"].split(":")[0].split(" (")[0] for s in steps] == [f"engine step {n}" for n in numbers]
    assert step_table.select(every, "11,12,13,14")[1] == every[-4:]
    assert step_table.select(every) == (step_table.step_numbers(every), every)
    for bad, msg in (("5,6,7", r"step\(s\) \[6\]"), ("15", r"\[15\]"), ("a", "comma-separated"), (",", "no engine")):
        with pytest.raises(ValueError, match=msg):
            step_table.select(every, bad)
    with pytest.raises(ValueError, match="entry 1 does not start"):
        step_table.step_numbers([{"knobs": {}, "rationale": "faster"}])


def test_profile_best_refuses_a_step_without_an_entry_before_loading(capsys) -> None:
    """profile_best.py --steps --only 9: one line naming the steps that exist, before any model is loaded."""
    pytest.importorskip("torch")
    import profile_best

    with pytest.raises(SystemExit) as exc:
        profile_best.main(["/no/such/model", "--steps", str(GPU / "engine_steps.json"), "--only", "9,10"])
    assert str(exc.value).startswith("profile_best: --only '9,10': no engine_steps.json entry for step(s) [9]")
    assert "1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 13, 14" in str(exc.value)


def test_profile_steps_runs_on_the_cpu() -> None:
    """profile_best.profile_steps over engine steps 1 and 4 on a tiny random Llama (CPU, eager, small
    sizes): every step's four parts measured, packing and the fused prefill switched per step, and
    the result goes through the table writer. The profiler runs on the torch step only (under the
    Triton interpreter it records every numpy call of every program: minutes)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from test_fastengine import _random_llama  # noqa: PLC0415  (beside this file)
    from triton_interp import import_interpreted  # noqa: PLC0415

    import_interpreted()
    import profile_best
    from hfserve.fast import FastModel

    every = json.loads((GPU / "engine_steps.json").read_text())
    steps = [every[0], every[-1]]  # the unfused one and the one with everything (interpreted: ~10 s a step)
    with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
        mp.setenv("TRITON_INTERPRET", "1")
        # The last step's (triton-mv) batch-1 GEMVs interpreted would take ~1 min here: they run as
        # x @ w.t() (test_fastengine.test_mv_kernels_equal_triton holds them to triton's step).
        patch_kernels(mp, sys.modules["hfserve.hfkernels"], "MV_MAX_ROWS", 0)
        fm = FastModel(_random_llama(torch.float32), slots=6, capacity=300)
        mp.setattr(profile_best, "cuda_time", lambda fn, reps=1: (fn(), 1.0)[1])
        real = profile_best.kernel_times  # the profiler over interpreted Triton is minutes: torch steps only

        def times(fn):
            # (the interpreted steps' code ran already, in cuda_time)
            return real(fn) if fm.kernels == "torch" and fm.prefill_attn == "torch" else {"interpreted": 1.0}

        mp.setattr(profile_best, "kernel_times", times)
        saved: list[list[int]] = []  # main_steps writes its JSON after each step (a cut command keeps them)
        out = profile_best.profile_steps(fm, steps, burst=3, prompt=6, long_len=16, b_pos=20, ctx=256,
                                         on_step=lambda done: saved.append([s["step"] for s in done]))
    # numbered as engine steps by their rationale (the last entry is step 14, the twelfth entry: 6 and 9 have none)
    assert saved == [[1], [1, 14]] and len(every) == 12
    assert [s["step"] for s in out] == [1, 14] and not any("error" in s for s in out)
    assert [s["batch"] for s in out] == [3, 3]  # min(burst, max_batch_size)
    assert all(set(s["parts"]) == set(step_table.PARTS) for s in out)
    assert all(p["kernels_ms"] for s in out for p in s["parts"].values())
    assert out[0]["prefill_check"] == {"max_abs_logit_diff_vs_first": 0.0, "top1_same_as_first": True}
    assert out[1]["prefill_check"]["top1_same_as_first"] and out[1]["prefill_check"]["max_abs_logit_diff_vs_first"] < 1e-3
    assert (fm.kernels, fm.prefill_attn, fm.decode_attn) == ("triton-mm", "fused-batched", "lowp")  # the last step's settings
    assert fm.mm_glu and fm.mm_norm and sys.modules["hfserve.hfkernels"].pdl_on()  # steps 11-13's (PDL: the CPU launches as before)
    sys.modules["hfserve.hfkernels"].set_pdl(False)
    # The graph step's logits against the first step's: the Triton GEMVs (B decode at batch 1) agree.
    assert out[0]["decode_check"] == {"max_abs_logit_diff_vs_first": 0.0, "top1_same_as_first": True,
                                      "greedy16_same_as_first": 16}
    dc = out[1]["decode_check"]
    assert dc["top1_same_as_first"] and dc["max_abs_logit_diff_vs_first"] < 1e-3 and dc["greedy16_same_as_first"] == 16
    table = step_table.markdown_table({"floors": FLOORS, "steps": out})
    assert table.count("\n") == 2 + 4 * len(steps)
    # a valid markdown table: the separator row has as many cells as the header and every row
    assert len({line.count("|") for line in table.splitlines()}) == 1
