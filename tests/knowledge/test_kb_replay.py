"""The replayed KB benchmark's parts: knob-set equivalence, paired ratios, the real proposer's warm start.

Fast: a synthetic table instead of measured servers (benchmarks/kb_table.py measures the real one).
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import kb_replay as R  # noqa: E402
import kb_table as T  # noqa: E402

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
    assert len(grid) == 576 and len({T.behaviour_key(k) for k in grid}) == 108
    # batching on ignores decode_loop and kv_cache; batching off ignores max_batch_size
    assert T.behaviour_key(B) == T.behaviour_key(B | {"decode_loop": "generate", "kv_cache": "static"})
    off = B | {"batching": "off", "decode_loop": "generate"}
    assert T.behaviour_key(off) == T.behaviour_key(off | {"max_batch_size": 1})
    assert T.behaviour_key(off) != T.behaviour_key(off | {"kv_cache": "static"})
    assert t.render(B, port=1, model="M", source="S", python="py")[:2] == ["py", "S/server.py"]


def _row(role, knobs, thr, error=None):
    r = {"model": "m", "workload": "throughput", "role": role, "key": T.behaviour_key(knobs), "knobs": knobs,
         "metrics": {"output_throughput": thr, "tpot_ms_mean": 1000 / thr}}
    return r | ({"error": error} if error else {})


def test_table_ratio_is_paired_with_neighbouring_baselines():
    base = T.grid_target().baseline_knobs()
    rows = [_row("baseline", base, 100.0), _row("candidate", B, 300.0), _row("baseline", base, 400.0),
            _row("candidate", B | {"threads": 1}, 50.0, error="boom")]
    tab = R.Table(rows, "m", "throughput")
    assert tab.ratio(B) == pytest.approx(300.0 / 200.0)  # geomean of 100 and 400
    assert tab.ratio(B | {"threads": 1}) is None and tab.ratio(base) == 1.0
    dec = R.Table([r | {"workload": "decode"} for r in rows], "m", "decode")
    assert dec.ratio(B) == pytest.approx(300.0 / 200.0)  # TPOT: lower is better, the ratio still >1 when faster


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
    base = T.grid_target().baseline_knobs()
    path.write_text("\n".join(json.dumps(r) for r in [_row("baseline", base, 100.0), _row("candidate", B, 250.0),
                                                      _row("baseline", base, 100.0)]))
    score = R._live(path, "m", None, "throughput")
    assert score(B) == pytest.approx(2.5)
    with pytest.raises(SystemExit, match="lacks"):
        score(B | {"threads": 0})
