"""The GPU run's files parse and fit together, on any machine (no GPU needed).

examples/targets/hfserve_gpu.toml renders launch commands that the server's own argument parser
accepts; benchmarks/gpu/goal.toml and scenarios.toml load; a workspace's `bench.scenarios` replaces
the built-in scenarios of the same name.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from orchestrator.bench.scenarios import load_scenarios_file
from orchestrator.config.goal import load_goal
from orchestrator.config.workspace import Workspace
from orchestrator.runs import _scenarios
from orchestrator.targets import load_target
from orchestrator.targets.space import active_only

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"


def _server_parser():
    pytest.importorskip("torch")
    from hfserve.server import parse_args

    return parse_args


@pytest.mark.parametrize("engine", ["hf-generate", "hf-manual", "fast-eager", "fast-graphs"])
def test_gpu_target_renders_valid_server_args(engine: str) -> None:
    target = load_target(ROOT / "examples/targets/hfserve_gpu.toml")
    parse = _server_parser()
    every = {"engine": engine, "batching": "on", "max_batch_size": 16, "prefill_chunk": 256, "sdpa": "flash",
             "kernels": "triton", "prefill_pack": 8192, "prefill_attn": "fused"}
    knobs = active_only(target, every)  # what the search proposes: only the knobs that exist here
    fast = engine.startswith("fast")
    graphs = engine == "fast-graphs"
    assert set(knobs) == ({"engine", "batching", "max_batch_size"} | ({"prefill_chunk", "sdpa", "prefill_pack", "prefill_attn"} if fast else set())
                          | ({"kernels"} if graphs else set()))
    args = parse(target.render(knobs, port=8000, model="/m", source="/s")[3:])  # drop `python -m hfserve`
    assert args.device == "cuda" and args.dtype == "bfloat16"
    assert args.engine == ("fast" if fast else "hf")
    assert args.cuda_graphs == ("on" if engine == "fast-graphs" else "off")
    assert args.decode_loop == ("manual" if engine == "hf-manual" else "generate")
    assert (args.batching, args.max_batch_size) == ("on", 16)
    assert (args.prefill_chunk, args.sdpa) == ((256, "flash") if fast else (0, "auto"))
    assert (args.prefill_pack, args.prefill_attn) == ((8192, "fused") if fast else (0, "torch"))
    assert args.kernels == ("triton" if graphs else "torch")  # the knob exists only with graphs
    # Batching off: the batch size does not exist, so it cannot be passed.
    off = active_only(target, every | {"batching": "off"})
    assert "max_batch_size" not in off and "--max-batch-size" not in target.render(off, port=8000, model="/m", source="/s")


def test_gpu_goal_and_scenarios_load(tmp_path: Path) -> None:
    goal = load_goal(GPU / "goal.toml")
    assert goal.accuracy_mode == "gated" and set(goal.scenarios) == {"prefill", "decode", "throughput"}
    # The time-to-best goal: 4x on TPOT (decode) and throughput, no TTFT objective.
    ttb = load_goal(GPU / "goal_4x.toml")
    assert ttb.accuracy_mode == "gated" and set(ttb.scenarios) == {"decode", "throughput"}
    assert sorted((o.metric, o.value) for o in ttb.objectives) == [("throughput", 3.0), ("tpot", 0.75)]
    # The goal only the best region meets (15x throughput): an H200 run's #1 (9.6x) misses it.
    best = load_goal(GPU / "goal_best.toml")
    assert best.accuracy_mode == "gated" and set(best.scenarios) == {"decode", "throughput"}
    assert sorted(o.speedup(o.target_for(1.0), 1.0) for o in best.objectives) == [4.0, 19.0]
    # The small model's exploring goal (warm run): a throughput no setting reaches, so it searches its budget.
    explore = load_goal(GPU / "goal_explore.toml")
    assert set(explore.scenarios) == set(best.scenarios) and explore.accuracy_mode == "gated"
    assert sorted(o.speedup(o.target_for(1.0), 1.0) for o in explore.objectives) == [4.0, 60.0]
    table = load_scenarios_file(GPU / "scenarios.toml")
    assert table["prefill"].prompt_tokens == 4096 and table["throughput"].concurrency == 16
    (tmp_path / "infergoal.toml").write_text(f'[bench]\nscenarios = "{GPU / "scenarios.toml"}"\n')
    ws = Workspace(tmp_path)
    merged = _scenarios(ws, ws.config)
    assert merged["decode"].output_tokens == 64 and "prefix" in merged  # others stay built in


def test_missing_scenarios_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="bench.scenarios"):
        load_scenarios_file(tmp_path / "nope.toml")


def test_kernels_knob_and_engine_steps() -> None:
    """The `kernels` knob: torch by default, only under fast-graphs; the scripted engine steps are valid
    knob sets of this target (naive baseline -> fast-graphs with batching -> + triton kernels)."""
    import json

    target = load_target(ROOT / "examples/targets/hfserve_gpu.toml")
    knob = target.knobs["kernels"]
    assert (knob.type, list(knob.choices), knob.default, knob.flag) == ("categorical", ["torch", "triton", "triton-gemv",
                                                                         "triton-mv", "triton-mm"],
                                                                        "torch",
                                                                        "--kernels")
    assert knob.when == {"engine": "fast-graphs"}
    assert "kernels" not in target.baseline_knobs()  # the naive baseline has no such knob
    steps = json.loads((GPU / "engine_steps.json").read_text())
    full = [target.validate_knobs(s["knobs"]) for s in steps]
    assert [k.get("kernels") for k in full] == ["torch", "triton", "triton", "triton", "triton-gemv", "triton-mv",
                                                "triton-mv"] + ["triton-mm"] * 5
    assert [(k["max_batch_size"], k["prefill_pack"], k["prefill_attn"]) for k in full] == [
        (16, 0, "torch"), (16, 0, "torch"), (64, 32768, "torch"), (64, 32768, "fused"), (64, 32768, "fused"),
        (64, 32768, "fused"), (64, 32768, "fused")] + [(64, 32768, "fused-batched")] * 5
    assert [k["overlap_schedule"] for k in full] == ["off"] * 6 + ["on"] * 6  # step 8: the overlap schedule
    assert [k.get("decode_attn") for k in full[4:]] == ["default"] * 3 + ["lowp"] * 5  # step 10
    assert [(k.get("mm_glu"), k.get("mm_norm"), k.get("pdl")) for k in full[7:]] == [  # steps 11-14
        ("off", "off", "off"), ("on", "off", "off"), ("on", "on", "off"), ("on", "on", "on"), ("on", "on", "on")]
    assert [(k.get("gc_freeze"), k.get("prefill_rounds")) for k in full[-2:]] == [("off", 1), ("on", 2)]  # step 14
    assert all(k["engine"] == "fast-graphs" and k["batching"] == "on" for k in full)
    parse = _server_parser()
    args = parse(target.render(full[6], port=8000, model="/m", source="/s")[3:])
    assert (args.kernels, args.cuda_graphs, args.engine) == ("triton-mv", "on", "fast")
    assert (args.max_batch_size, args.prefill_pack, args.prefill_attn) == (64, 32768, "fused")
    assert args.overlap_schedule == "on" and parse(target.render(full[5], port=8000, model="/m",
                                                                 source="/s")[3:]).overlap_schedule == "off"
    args = parse(target.render(full[7], port=8000, model="/m", source="/s")[3:])
    assert (args.kernels, args.prefill_attn, args.decode_attn, args.prefill_rounds) == (
        "triton-mm", "fused-batched", "lowp", 1)
    args = parse(target.render(full[-1], port=8000, model="/m", source="/s")[3:])
    assert (args.kernels, args.mm_glu, args.mm_norm, args.pdl) == ("triton-mm", "on", "on", "on")  # the server takes step 14
    assert (args.gc_freeze, args.prefill_rounds) == ("on", 2)


@pytest.mark.parametrize("argv", [["--engine", "fast"], ["--engine", "hf", "--cuda-graphs", "on"]])
def test_server_refuses_triton_kernels_without_graphs(argv: list[str]) -> None:
    parse = _server_parser()
    for kern in ("triton", "triton-gemv", "triton-mv"):
        with pytest.raises(SystemExit, match=f"--kernels {kern} needs --engine fast --cuda-graphs on"):
            parse(["--model", "/m", "--port", "1", "--kernels", kern, *argv])
    assert parse(["--model", "/m", "--port", "1", *argv]).kernels == "torch"


@pytest.mark.parametrize(("knob", "value", "default"), [
    ("decode_attn", "lowp", "default"), ("decode_attn", "lowp-reg", "default"), ("kv_cache_dtype", "fp8", "auto")])
def test_triton_only_knobs_exist_only_with_the_triton_kernels(knob: str, value: str, default: str) -> None:
    """--decode-attn (bf16 dots + the H200 launch table) and --kv-cache-dtype (an fp8 pool) are knobs only where
    the Triton kernels run: CUDA graphs and kernels other than torch; rendered, they parse; asked for without
    them, refused."""
    target = load_target(ROOT / "examples/targets/hfserve_gpu.toml")
    parse = _server_parser()
    base = {"engine": "fast-graphs", "batching": "on", "max_batch_size": 64, knob: value}
    for kern in ("triton", "triton-gemv", "triton-mv", "triton-mm"):
        knobs = active_only(target, base | {"kernels": kern})
        assert knobs[knob] == value
        args = parse(target.render(knobs, port=8000, model="/m", source="/s")[3:])
        assert (args.kernels, getattr(args, knob)) == (kern, value)
    assert knob not in active_only(target, base | {"kernels": "torch"})
    assert knob not in active_only(target, base | {"engine": "fast-eager"})
    assert target.knobs[knob].default == default and knob not in target.baseline_knobs()
    flag = "--" + knob.replace("_", "-")
    with pytest.raises(SystemExit, match=f"{flag} {value} needs --kernels triton"):
        parse(["--model", "/m", "--port", "1", "--engine", "fast", "--cuda-graphs", "on", flag, value])


def test_wheels_for_the_gpu_machine_are_the_orchestrators_closure_minus_the_image(capsys) -> None:
    """benchmarks/gpu/wheels.py --dry-run: the pinned list holds the orchestrator's own dependencies the H200 image
    lacks (and what they need), at this venv's versions, and none of the image's packages."""
    from importlib import metadata

    spec = importlib.util.spec_from_file_location("gpu_wheels", GPU / "wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run"]) == 0
    pins = dict(line.split("==") for line in capsys.readouterr().out.split())
    for name in ("anthropic", "gitpython", "paramiko", "pydantic", "sqlalchemy", "tenacity", "optuna", "pydantic-core"):
        assert pins[name] == metadata.version(name)
    assert not set(pins) & mod.IMAGE and "torch" not in pins and "jinja2" not in pins


@pytest.mark.parametrize(("knob", "beside", "kernels", "refusal"), [
    ("mm_glu", {}, "triton-mv", "--mm-glu on needs --kernels triton-mm, not triton-mv"),
    ("mm_norm", {"mm_glu": "on"}, "triton", "--mm-norm on needs --kernels triton-mm, not triton"),
])
def test_skinny_gemm_fusions_are_knobs_of_the_skinny_gemm_only(
        knob: str, beside: dict[str, str], kernels: str, refusal: str) -> None:
    """--mm-glu (gate/up + SwiGLU in one skinny-GEMM launch) and --mm-norm (the norms folded into the skinny GEMMs,
    with --mm-glu beside it) are knobs only with --kernels triton-mm under CUDA graphs: rendered, each parses; with
    any other kernels it is not in the knob set, and the server refuses it in one line."""
    target = load_target(ROOT / "examples/targets/hfserve_gpu.toml")
    parse = _server_parser()
    base = {"engine": "fast-graphs", "batching": "on", "max_batch_size": 64, knob: "on"} | beside
    knobs = active_only(target, base | {"kernels": "triton-mm"})
    assert knobs[knob] == "on"
    args = parse(target.render(knobs, port=8000, model="/m", source="/s")[3:])
    assert (args.kernels, getattr(args, knob)) == ("triton-mm", "on")
    assert {k: getattr(args, k) for k in beside} == beside
    for kern in ("torch", "triton", "triton-gemv", "triton-mv"):
        assert knob not in active_only(target, base | {"kernels": kern})
    assert target.knobs[knob].default == "off" and knob not in target.baseline_knobs()
    with pytest.raises(SystemExit, match=refusal):
        parse(["--model", "/m", "--port", "1", "--engine", "fast", "--cuda-graphs", "on", "--kernels", kernels,
               "--" + knob.replace("_", "-"), "on"])


def test_pdl_is_a_knob_of_the_triton_kernels() -> None:
    """--pdl (programmatic dependent launch of the Triton kernels) is a knob with any Triton kernels under CUDA graphs:
    rendered, it parses; with the torch kernels it is not in the knob set, and the server refuses it in one line."""
    target = load_target(ROOT / "examples/targets/hfserve_gpu.toml")
    parse = _server_parser()
    base = {"engine": "fast-graphs", "batching": "on", "max_batch_size": 64, "pdl": "on"}
    for kern in ("triton", "triton-gemv", "triton-mv", "triton-mm"):
        knobs = active_only(target, base | {"kernels": kern})
        assert knobs["pdl"] == "on"
        args = parse(target.render(knobs, port=8000, model="/m", source="/s")[3:])
        assert (args.kernels, args.pdl) == (kern, "on")
    assert "pdl" not in active_only(target, base | {"kernels": "torch"})
    assert target.knobs["pdl"].default == "off" and "pdl" not in target.baseline_knobs()
    with pytest.raises(SystemExit, match="--pdl on needs --kernels triton"):
        parse(["--model", "/m", "--port", "1", "--engine", "fast", "--cuda-graphs", "on", "--pdl", "on"])
