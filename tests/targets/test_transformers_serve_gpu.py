"""The GPU target for `transformers serve` (examples/targets/transformers-serve-gpu.toml) and the grid script that
measures its knobs beside a goal run's best (benchmarks/gpu/tserve_grid.py), on the CPU.

Every knob's every value renders a command that the installed `transformers serve` parses into exactly those
settings (its own option parser, nothing launched); what the target leaves out is refused, every combination of
what it has is accepted. The grid script's real run against the CPU target is in the slow test at the end.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.targets import TargetError, load_target

ROOT = Path(__file__).resolve().parents[2]
GPU_TARGET = ROOT / "examples" / "targets" / "transformers-serve-gpu.toml"
CPU_TARGET = ROOT / "examples" / "targets" / "transformers-serve.toml"
GRID = ROOT / "benchmarks" / "gpu" / "tserve_grid.py"
sys.path.insert(0, str(GRID.parent))
import tserve_grid  # noqa: E402


@pytest.fixture(scope="module")
def serve_parser():
    """`transformers serve`'s own option parser (typer's click command over transformers' Serve)."""
    typer = pytest.importorskip("typer")
    serve = pytest.importorskip("transformers.cli.serve")
    app = typer.Typer()
    app.command()(serve.Serve)
    cmd = typer.main.get_command(app)

    def parse(argv: list[str]) -> dict:
        i = argv.index("serve")  # after `python -m transformers.cli.transformers serve`
        return cmd.make_context("serve", argv[i + 1:]).params

    return parse


def test_gpu_target_renders_every_knob_value_as_the_server_parses_it(serve_parser) -> None:
    t = load_target(GPU_TARGET)
    assert t.engine == "transformers-serve" and t.model == "forge:2b-peaked" and not t.capabilities.ignore_eos
    base = serve_parser(t.render(t.baseline_knobs(), port=8000, model="/m", source="/s"))
    assert (base["device"], base["dtype"], base["force_model"]) == ("cuda", "float32", t.served_model_name)
    # The defaults: float32 (bfloat16 is a knob), generate() per request, SDPA; nothing of continuous batching passed.
    assert base["continuous_batching"] is False and base["attn_implementation"] == "sdpa"
    assert (base["cb_block_size"], base["cb_max_batch_tokens"], base["cb_use_cuda_graph"]) == (None, None, None)
    assert base["compile"] is False
    seen = set()
    for name, knob in t.knobs.items():
        for v in (False, True) if knob.type == "bool" else knob.choices:
            knobs = t.validate_knobs({"continuous_batching": True, name: v})
            p = serve_parser(t.render(knobs, port=8000, model="/m", source="/s"))
            assert p["continuous_batching"] is knobs["continuous_batching"]
            got = {"dtype": p["dtype"], "continuous_batching": p["continuous_batching"],
                   "attn_implementation": p["attn_implementation"],
                   "cb_block_size": p["cb_block_size"], "cb_max_batch_tokens": p["cb_max_batch_tokens"] or 0,
                   "cb_cuda_graph": {None: "auto", True: "on", False: "off"}[p["cb_use_cuda_graph"]]}
            assert got[name] == v, (name, v, p)
            seen.add((name, v))
    assert len(seen) == 2 + 2 + 2 + 4 + 6 + 3
    # Without continuous batching its knobs do not exist, so they cannot be passed.
    off = t.validate_knobs({"continuous_batching": False, "cb_block_size": 64, "cb_cuda_graph": "on"})
    assert set(off) == {"dtype", "continuous_batching", "attn_implementation"}
    assert not any(a.startswith("--cb") for a in t.render(off, port=8000, model="/m", source="/s"))


def test_gpu_target_refuses_what_it_leaves_out_and_accepts_every_combination() -> None:
    t = load_target(GPU_TARGET)
    # flex_attention is out of the space (continuous batching refuses it; compiled per shape without it).
    with pytest.raises(TargetError, match="attn_implementation"):
        t.validate_knobs({"attn_implementation": "flex_attention"})
    with pytest.raises(TargetError, match="cb_block_size"):
        t.validate_knobs({"continuous_batching": True, "cb_block_size": 48})
    with pytest.raises(TargetError, match="unknown knob"):
        t.validate_knobs({"compile": True})  # left out of the GPU space (torch.compile at start-up)
    # No constraint: every combination of the knobs' values is a server that starts.
    combos = 0
    for dtype, cb, attn, block, tokens, graph in itertools.product(("float32", "bfloat16"), (False, True),
                                                                   ("sdpa", "eager"), (32, 64, 128, 256),
                                                                   (0, 256, 4096), ("auto", "on", "off")):
        t.validate_knobs({"dtype": dtype, "continuous_batching": cb, "attn_implementation": attn,
                          "cb_block_size": block, "cb_max_batch_tokens": tokens, "cb_cuda_graph": graph})
        combos += 1
    assert combos == 288 and not t.constraints


def test_grid_points_fold_repeats_list_refusals_and_put_the_goal_best_second(tmp_path: Path) -> None:
    t = load_target(GPU_TARGET)
    grid = tserve_grid.parse_grid(t, ["continuous_batching=false,true", "attn_implementation=sdpa,eager"])
    assert grid == {"continuous_batching": [False, True], "attn_implementation": ["sdpa", "eager"]}
    best = {"trial": 3, "knobs": {"continuous_batching": True, "attn_implementation": "sdpa", "cb_block_size": 64},
            "score": 5.1}
    pts = tserve_grid.points(t, grid, best)
    assert [p["label"] for p in pts] == ["default", "goal #3", *(f"continuous_batching={c} attn_implementation={a}"
                                         for c in (False, True) for a in ("sdpa", "eager"))]
    by = {p["label"]: p for p in pts}
    assert by["continuous_batching=False attn_implementation=sdpa"]["same_as"] == "default"
    assert "same_as" not in by["continuous_batching=True attn_implementation=sdpa"]  # block 256, not the best's 64
    assert by["goal #3"]["knobs"]["cb_block_size"] == 64
    # A combination the target's constraints refuse is listed, not launched (the CPU target's paged cache rule).
    cpu = load_target(CPU_TARGET)
    pts = tserve_grid.points(cpu, tserve_grid.parse_grid(cpu, ["continuous_batching=true", "cb_block_size=16,32",
                                                               "cb_num_blocks=32"]), None)
    assert ["refused" in p for p in pts] == [False, True, False] and "1024-token" in pts[1]["refused"]
    for bad, said in ((["nope=1"], "a knob of"), (["cb_block_size=48"], "not one of"),
                      (["continuous_batching=maybe"], "not a bool"), (["attn_implementation"], "NAME=V1,V2")):
        with pytest.raises(TargetError, match=said):
            tserve_grid.parse_grid(t, bad)


def test_grid_reads_the_goal_runs_best_kept_search_trial(tmp_path: Path) -> None:
    from orchestrator.config.goal import load_goal
    from orchestrator.store import Store

    db = tmp_path / "run.db"
    assert tserve_grid.goal_best(db) is None  # no database yet
    store = Store(f"sqlite:///{db}")
    g = load_goal(GRID.parent / "goal_tserve.toml")
    assert g.scenarios == ["throughput"] and g.accuracy_mode == "gated" and g.budget.trials == 6
    run = store.create_run("tserve-goal", g.text, g.model_dump(mode="json"), g.digest, {"name": "t"}, {}, "local",
                           "search")
    assert tserve_grid.goal_best(db)["trial"] is None  # a run with nothing kept beyond the baseline
    for number, proposer, status, score, knobs in (
            (0, "baseline", "kept", 1.0, {}),
            (1, "search", "kept", 3.2, {"continuous_batching": True}),
            (2, "search", "discarded", 9.0, {"attn_implementation": "eager"}),
            (3, "paired", "kept", 7.0, {"continuous_batching": True}),
            (4, "search", "kept", 4.4, {"continuous_batching": True, "cb_block_size": 64})):
        tr = store.create_trial(run.id, number, commit="c", knobs=knobs, rationale="", proposer=proposer)
        store.finish_trial(tr.id, status, score=score, objective={"throughput.output_throughput": score})
    best = tserve_grid.goal_best(db)
    assert (best["trial"], best["score"], best["knobs"]) == (4, 4.4, {"continuous_batching": True, "cb_block_size": 64})


def test_grid_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(GRID), "/m", "--target", str(GPU_TARGET), "--grid", "warp=9",
                        "--out", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.startswith("tserve_grid: --grid 'warp=9'") and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_grid_runs_against_real_transformers_serve(tmp_path: Path, tiny_model) -> None:
    """The grid end to end on the CPU target (forge:tiny): each point one real server, the bench's C, one table."""
    for mod in ("fastapi", "uvicorn", "accelerate"):
        pytest.importorskip(mod, reason="transformers serve needs fastapi, uvicorn and accelerate")
    scen = tmp_path / "sc.toml"
    scen.write_text("[throughput]\nprompt_tokens = 64\noutput_tokens = 8\nnum_requests = 4\nconcurrency = 4\n"
                    "warmup_requests = 1\nseed = 3\n")
    out = tmp_path / "grid.json"
    r = subprocess.run([sys.executable, str(GRID), str(tiny_model), "--target", str(CPU_TARGET), "--scenarios",
                        str(scen), "--grid", "continuous_batching=false,true", "--grid", "cb_num_blocks=32,256", "--grid", "cb_block_size=16",
                        "--db", str(tmp_path / "none.db"), "--out", str(out), "--budget-s", "240"],
                       capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    by = {p["label"]: p for p in res["points"]}
    assert res["goal_run"] is None and "goal run: no run in" in r.stdout
    assert by["default"]["score"] == pytest.approx(1.0)
    # The cb_* knobs only exist with batching on: both batching-off points are the defaults, measured once.
    assert by["continuous_batching=False cb_num_blocks=32 cb_block_size=16"]["same_as"] == "default"
    assert by["continuous_batching=False cb_num_blocks=256 cb_block_size=16"]["same_as"] == "default"
    # 32 blocks of 16 tokens cannot hold one 1024-token sequence: the target refuses it, nothing launched.
    assert "refused" in by["continuous_batching=True cb_num_blocks=32 cb_block_size=16"]
    on = by["continuous_batching=True cb_num_blocks=256 cb_block_size=16"]
    m = on["result"]["scenarios"]["throughput"]
    assert m["completed"] == 4 and m["failed"] == 0 and on["score"] > 0
    assert "--continuous-batching" in on["result"]["command"] and (tmp_path / "grid_logs" / "server_0.log").exists()
    table = r.stdout[r.stdout.index("point "):]
    assert "x default" in table and "refused" in table and "(= default)" in table


@pytest.mark.slow
def test_grid_stopped_by_its_time_limit_still_writes_what_it_measured(tmp_path: Path, tiny_model) -> None:
    """SIGTERM while a point is measured (the GPU tool's timeout): that server stopped, the rest skipped, the table
    and grid.json of the points measured before it."""
    for mod in ("fastapi", "uvicorn", "accelerate"):
        pytest.importorskip(mod, reason="transformers serve needs fastapi, uvicorn and accelerate")
    scen = tmp_path / "sc.toml"
    scen.write_text("[throughput]\nprompt_tokens = 64\noutput_tokens = 64\nnum_requests = 64\nconcurrency = 1\n"
                    "warmup_requests = 0\nseed = 3\n")
    out = tmp_path / "grid.json"
    proc = subprocess.Popen([sys.executable, str(GRID), str(tiny_model), "--target", str(CPU_TARGET), "--scenarios",
                             str(scen), "--grid", "attn_implementation=eager", "--grid", "continuous_batching=true,false",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    log = tmp_path / "grid_logs" / "server_0.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "POST /v1/completions" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # during the first point's bench (64 requests one at a time)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, stdout  # nothing measured but...
    res = json.loads(out.read_text())
    assert [p.get("skipped") for p in res["points"]] == ["stopped", "stopped", "stopped"], res["points"]
    assert "stopped at the command's limit" in stdout and "point " in stdout
    assert "Application shutdown complete" in log.read_text()  # its server stopped, not left running


def test_a_sigterm_the_bench_client_swallowed_still_stops_the_grid(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM raised inside an asyncio callback of the bench client is logged there and the bench goes on (CI saw a
    stopped grid measure every point and exit 0): the point it came during is still stopped, the rest skipped."""
    import os

    def measured(host, target, model, knobs, scenarios, log, timeout_s):
        try:  # what asyncio's transport does with an exception raised in its callback: log it, carry on
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
        except tserve_grid.Stopped:
            pass
        return {"ready_s": 1.0, "scenarios": {"throughput": {"output_throughput": 100.0}}, "command": "serve"}

    monkeypatch.setattr(tserve_grid, "measure", measured)
    monkeypatch.setattr(tserve_grid, "_SIGNALLED", [])
    scen = tmp_path / "sc.toml"
    scen.write_text("[throughput]\nprompt_tokens = 8\noutput_tokens = 8\nnum_requests = 1\nconcurrency = 1\n")
    out = tmp_path / "grid.json"
    before = signal.getsignal(signal.SIGTERM)
    try:
        rc = tserve_grid.main(["MODEL", "--target", str(CPU_TARGET), "--scenarios", str(scen), "--out", str(out),
                               "--grid", "continuous_batching=true,false"])
    finally:
        signal.signal(signal.SIGTERM, before)
    points = json.loads(out.read_text())["points"]
    assert rc == 1 and [p.get("skipped") for p in points] == ["stopped", "stopped", "stopped"], points
    assert not any(p.get("result") for p in points)


def test_grid_table_shows_every_kind_of_point() -> None:
    from orchestrator.config.goal import load_goal

    goal = load_goal(GRID.parent / "goal_tserve.toml")

    def measured(tok_s: float) -> dict:
        return {"ready_s": 12.3, "scenarios": {"throughput": {"output_throughput": tok_s, "tpot_ms_p50": 20.0}}}

    rows = [{"label": "default", "knobs": {"dtype": "float32"}, "result": measured(100.0)},
            {"label": "goal #4", "knobs": {"continuous_batching": True}, "result": measured(520.0),
             "goal": {"trial": 4, "score": 5.37}},
            {"label": "a", "knobs": {}, "refused": 'constraint "x" broken by y: the cache is too small'},
            {"label": "b", "knobs": {}, "skipped": "no time"},
            {"label": "c", "knobs": {}, "error": "the server exited during start-up (exit 1)"},
            {"label": "d", "knobs": {"dtype": "float32"}, "result": measured(100.0), "same_as": "default"}]
    base = rows[0]["result"]["scenarios"]
    for r in rows:
        if "result" in r:
            r["score"] = tserve_grid.score(goal, r["result"]["scenarios"], base)
    lines = tserve_grid.table(rows, goal).splitlines()
    assert lines[0].split()[:3] == ["point", "x", "default"] and len(lines) == 7
    assert "5.20x" in lines[2] and "5.37x (#4)" in lines[2] and "520.0" in lines[2]
    assert "refused" in lines[3] and "the cache is too small" in lines[3]
    assert "no time" in lines[4] and "failed" in lines[5] and "exited during start-up" in lines[5]
    assert lines[6].endswith("(= default)") and "1.00x" in lines[6]
