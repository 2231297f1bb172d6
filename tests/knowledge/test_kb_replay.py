"""The replayed KB benchmark's parts: knob-set equivalence, paired ratios, the real proposer's warm start.

Fast: a synthetic table instead of measured servers (benchmarks/kb_table.py measures the real one).
"""

import json
import sys
from pathlib import Path

import kb_replay as R  # noqa: E402
import kb_table as T  # noqa: E402
import pytest

from orchestrator.knowledge import KnowledgeBase  # noqa: E402
from orchestrator.store import Store  # noqa: E402

B = {"attn": "sdpa", "batching": "on", "decode_loop": "manual", "dtype": "float32", "kv_cache": "dynamic",
     "max_batch_size": 16, "threads": 2}


def _score(k):
    """A surface with one good corner (batching on, large batch, sdpa, 2 threads)."""
    s = 1.0
    if k["batching"] == "on":
        s *= 1.5 * (1 + 0.25 * T.BATCH_GRID.index(k["max_batch_size"]))
    elif k["decode_loop"] == "manual":
        s *= 1.2
    s *= (0.5 if k["dtype"] == "bfloat16" else 1.0) * (1.3 if k["attn"] == "sdpa" else 1.0)
    return s * {0: 1.0, 1: 0.7, 2: 1.1}[k["threads"]]


def test_grid_and_equivalent_knob_sets():
    t = T.grid_target()
    grid = T.knob_grid(t)
    def key(k, w="throughput"):
        return T.behaviour_key(k, w)

    assert len(grid) == 576 and len({key(k) for k in grid}) == 56 and len({key(k, "decode") for k in grid}) == 32
    # batching on ignores decode_loop and kv_cache; batching off ignores max_batch_size
    assert key(B) == key(B | {"decode_loop": "generate", "kv_cache": "static"})
    off = B | {"batching": "off", "decode_loop": "generate"}
    assert key(off) == key(off | {"max_batch_size": 1}) != key(off | {"kv_cache": "static"})
    # the batch never exceeds the requests in flight (8 in the throughput scenario, 1 in decode)
    assert key(B) == key(B | {"max_batch_size": 32}) != key(B | {"max_batch_size": 4})
    assert key(B, "decode") == key(B | {"max_batch_size": 1}, "decode")
    assert key(B) == key(B | {"threads": 0}) != key(B | {"threads": 1})  # torch's default: 2 threads here
    assert t.render(B, port=1, model="M", source="S", python="py")[:3] == ["py", "-m", "hfserve"]


def _row(knobs, cand, base=(100.0, 100.0), foreign=0.1, error=None):
    """A measured row: baseline and candidate blocks interleaved (B C B ...), others' load per block."""
    r = {"model": "m", "workload": "throughput", "key": T.behaviour_key(knobs, "throughput"), "knobs": knobs,
         "base": list(base), "cand": list(cand), "foreign_cores": [0.0] + [foreign, 0.0] * len(cand)}
    return r | ({"error": error} if error else {})


def test_table_uses_quiet_blocks_against_the_tables_quiet_baseline():
    rows = [_row(B, [900.0], foreign=1.5), _row(B, [140.0, 150.0]), _row(B, [700.0], foreign=1.2),
            _row(B | {"threads": 1}, [], error="boom"), _row(B | {"threads": 1, "max_batch_size": 4}, [200.0], foreign=1.0),
            _row(B | {"max_batch_size": 2}, [120.0], base=(90.0, 20.0, 110.0))]
    rows[-1]["foreign_cores"] = [0.0, 0.0, 1.0]  # the second baseline block ran beside a busy core
    tab = R.Table(rows, "m", "throughput")
    assert tab.base_ref == 100.0  # median of the quiet baseline blocks; the 20 tok/s one is left out
    assert tab.ratio(B) == 1.5  # the trusted row's best block, not the busy-host rows around it
    assert tab.ratio(B | {"threads": 1}) is None and tab.ratio(T.grid_target().baseline_knobs()) == 1.0
    assert tab.untrusted == [T.behaviour_key(B | {"threads": 1, "max_batch_size": 4}, "throughput")] and tab.best == 2.0
    assert not T.trusted(_row(B, [2.0], foreign=1.0)) and T.trusted(_row(B, [2.0]))
    assert not T.trusted(_row(B, [2.0]) | {"capped": True})  # a block hit the time cap: a bound, not a value
    dec = R.Table([rows[1] | {"workload": "decode", "key": T.behaviour_key(B, "decode")}], "m", "decode")
    assert dec.ratio(B) == pytest.approx(100.0 / 140.0)  # TPOT: lower is better (here the values are TPOTs)


def test_warm_start_from_a_run_reaches_b_first_and_random_differs(tmp_path):
    t = T.grid_target()
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    a = R.replay_run(_score, t, store, label="A", seed=0, budget=25, goal_x=2.5, stop_at_goal=True)
    kb = KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "kb")
    kb.write_back(store, a["run_id"], engine="hfserve", model="forge:tiny", hardware=R.HOST, workload="throughput@1")
    plan = KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "w").priors(
        engine="hfserve", model="forge:small", hardware=R.HOST, workload="throughput@1")
    assert plan and 0.5 < plan[0]["similarity"] < 1.0
    warm = R.replay_run(_score, t, store, label="Bw", seed=1, budget=10, goal_x=2.5, warm=[p["knobs"] for p in plan])
    first = store.list_trials(warm["run_id"])[1]
    assert first.rationale.startswith("warm start") and first.knobs == plan[0]["knobs"]
    assert warm["scores"][0] == pytest.approx(_score(plan[0]["knobs"]))
    tpe = R.replay_run(_score, t, store, label="Bt", seed=1, budget=12, goal_x=99)
    rnd = R.replay_run(_score, t, store, label="Br", seed=1, budget=12, goal_x=99, random_search=True)
    assert tpe["scores"][:3] == rnd["scores"][:3]  # the same random start-up trials (the baseline is the 4th)
    assert tpe["scores"] != rnd["scores"] and not tpe["goal_met"] and tpe["trials_to_goal"] == 13
    assert R.within([1.0, None, 2.0, 3.0], 3.1) == 4 and R.within([1.0], 3.0) is None


def test_live_score_measures_misses_only_when_allowed(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_row(B, [250.0])) + "\n")
    score = R._live(path, "m", None, "throughput")
    assert score(B) == pytest.approx(2.5)
    with pytest.raises(SystemExit, match="lacks"):
        score(B | {"threads": 1})


def test_stopping_once_the_reported_numbers_are_known_changes_none_of_them(tmp_path):
    """`known` only cuts the tail of a run: every number `summarise` reports is the same as for the
    full budget, and the run is shorter (the replay's time)."""
    t = T.grid_target()
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    best = max(_score(k) for k in T.knob_grid(t))
    full, cut = [], []
    for seed in (0, 1000, 2000):
        full.append(R.replay_run(_score, t, store, label=f"f{seed}", seed=seed, budget=40, goal_x=2.5))
        cut.append(R.replay_run(_score, t, store, label=f"c{seed}", seed=seed, budget=40, goal_x=2.5, known=(10, best)))
    assert R.summarise(cut, 10, best) == R.summarise(full, 10, best)
    assert sum(len(r["scores"]) for r in cut) < sum(len(r["scores"]) for r in full)
    assert all(len(r["scores"]) >= 10 for r in cut)


def test_the_conditional_space_holds_each_behaviour_once_per_active_knob_set():
    """The shipped target: decode_loop and kv_cache exist only with batching off (kv_cache only with
    generate), max_batch_size only with batching on; a knob set scores as the full one it stands for,
    and the server is launched without the flags of the knobs it would ignore."""
    full, cond = T.grid_target(), T.grid_target(conditional=True)
    grid = T.knob_grid(cond)
    assert len(grid) == 2 * 3 * 2 * 3 + 2 * 6 * 2 * 3 == 108  # batching off: 36; on: 72
    on = next(k for k in grid if k["batching"] == "on" and k["max_batch_size"] == 16)
    assert "decode_loop" not in on and "kv_cache" not in on
    assert T.behaviour_key(on, "throughput") == T.behaviour_key(full.baseline_knobs() | on, "throughput")
    assert {T.behaviour_key(k, "throughput") for k in grid} == {T.behaviour_key(k, "throughput") for k in T.knob_grid(full)}
    argv = cond.render(on, port=1, model="M", source="S", python="py")
    assert argv[argv.index("--max-batch-size") + 1] == "16" and "--decode-loop" not in argv and "--kv-cache" not in argv
    off = next(k for k in grid if k["batching"] == "off" and k["decode_loop"] == "generate" and k["kv_cache"] == "static")
    argv = cond.render(off, port=1, model="M", source="S", python="py")
    assert argv[argv.index("--kv-cache") + 1] == "static" and "--max-batch-size" not in argv
    # the table's servers get the same flags: the left-out knobs at their defaults, the inactive ones left out
    argv = T.launch_argv(cond, {"batching": "on", "max_batch_size": 16}, 1, "M")
    assert argv[argv.index("--max-batch-size") + 1] == "16" and "--decode-loop" not in argv and "--kv-cache" not in argv
    assert "--decode-loop" in T.launch_argv(full, {"batching": "on"}, 1, "M")  # the flat space: every knob active


def test_probe_winner_measures_the_one_knob_neighbours_as_the_product_does(tmp_path):
    """--probe-winner N: a source run ends with its winner's one-knob neighbours (the shipped
    target's `neighbours`: batch x2 and /2, every other value otherwise), at most N, recorded as
    the controller's `probe` trials; the write-back keeps them out of the search's observations."""
    from orchestrator.knowledge.distill import distill

    t = T.grid_target()
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    a = R.replay_run(_score, t, store, label="A", seed=0, budget=12, goal_x=99)
    n = R.probe_winner(_score, t, store, a["run_id"], limit=9)
    trials = store.list_trials(a["run_id"])
    win = store.get_trial(store.get_run(a["run_id"]).best_trial_id).knobs
    probes = [x for x in trials if x.proposer == "probe"]
    assert n == len(probes) > 0 and all(sum(p.knobs[k] != win[k] for k in win) == 1 for p in probes)
    sizes = {p.knobs["max_batch_size"] for p in probes} - {win["max_batch_size"]}
    assert sizes <= {win["max_batch_size"] // 2, win["max_batch_size"] * 2}  # adjacent sizes only
    assert len(probes) <= 1 + 1 + 1 + 2 + 1 + 1 + 2  # dtype, loop, batching, 2 batch sizes, kv, attn, 2 threads
    assert R.probe_winner(_score, t, store, a["run_id"], limit=9) == 0  # nothing measured twice
    d = distill(store, a["run_id"])
    assert len(d.probes) == n and not any(o["knobs"] == p.knobs for o in d.observations for p in probes)


def test_the_replay_runs_on_the_measured_tables_with_probes_and_rotated(tmp_path):
    """The benchmark's command line on the committed tables, no server: --probe-winner makes both
    source runs end with probes, and with two sources the warm-ac runs try swaps; --target C replays
    on model C with B as the second source."""
    import subprocess

    out = tmp_path / "r.json"
    cmd = [sys.executable, str(Path(R.__file__)), "--seeds", "2", "--budget", "20", "--goal", "4.0", "--goal-a", "10",
           "--budget-a", "12", "--arms", "cold", "warm-ac", "--probe-winner", "9", "--target", "C", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    d = json.loads(out.read_text())
    assert d["A"]["throughput"]["probes"] > 0 and d["C"]["throughput"]["probes"] > 0  # C's key holds the second source
    assert d["C"]["throughput"]["label"] == "B-throughput"  # rotated: B is the second source
    assert {r["label"].split("-s")[0] for rows in d["runs"].values() for r in rows} == {"C-cold", "C-warm-ac"}
    assert d["space"]["best"] == pytest.approx(4.18, abs=0.01)  # C's table
    store = Store(f"sqlite:///{Path(d['db'])}")
    swapped = [t for r in store.list_runs() if r.name.startswith("C-warm-ac") for t in store.list_trials(r.id)
               if t.rationale.startswith("swap")]
    assert swapped  # two sources with probes: the search tried swaps
