"""The multi-fidelity replay (benchmarks/mf_replay.py) on a small synthetic table: fast, no server."""


import kb_table as T  # noqa: E402
import mf_replay as M  # noqa: E402

FIX = {"dtype": "float32", "kv_cache": "dynamic", "decode_loop": "manual", "threads": 2}


def _rows():
    """One row per behaviour of the fixed space: batching on with a larger batch is faster, sdpa a bit;
    three candidate blocks each (the spread the short bench's noise is drawn from), all quiet."""
    rows, seen = [], set()
    for k in T.knob_grid(T.grid_target(fixed=FIX)):
        key = T.behaviour_key(k, "throughput")
        if key in seen:
            continue
        seen.add(key)
        v = 100.0 * (1 + (T.BATCH_GRID.index(k["max_batch_size"]) if k["batching"] == "on" else 0)) * (1.2 if k["attn"] == "sdpa" else 1)
        rows.append({"model": "forge:small", "workload": "throughput", "key": key, "knobs": k, "base": [100.0, 100.0],
                     "cand": [v * 0.97, v, v * 1.03], "base_foreign": [0.0, 0.0], "cand_foreign": [0.0, 0.0, 0.0]})
    return rows


def test_the_replay_screens_with_the_product_decision_and_reports_best_and_bench_time():
    out = M.run("small", seeds=4, budget=8, fraction=0.25, fix=FIX, rows=_rows())
    s = out["summary"]
    # 2 waves of 8; the baseline's blocks agree exactly (noise 0), so the margin is the floor
    assert out["short_requests"] == 16 and out["of"] == 48 and out["baseline_noise"] == 0.0 and out["margin"] == 0.10
    assert s["seeds"] == 4 and 0 <= s["same_best"] <= 4 and s["same_best_frac"] == s["same_best"] / 4
    for r in out["runs"]:
        full, scr = r["full"], r["screened"]
        assert full["screened"] == 0 and full["bench_s"] > 0
        # Every knob set's bench time: requests x 32 tokens / its throughput (table ratio x 100 tok/s).
        assert scr["bench_s"] != full["bench_s"] or scr["screened"] == 0
    # With a 3% spread the short bench of the grid's best cannot fall 10% below a worse best: never lost.
    assert s["missed_keeps"] == 0 and s["screened_best_not_lower"] == 4
    assert s["bench_saved_total"] > 0 and max(r["screened"]["screened"] for r in out["runs"]) > 0


def test_the_replay_compares_start_ups_on_the_same_full_runs():
    """`--startup 4,0`: one full run per seed, one screened run per start-up; with a start-up of 4 a
    budget of 3 search trials (4 full measurements with the baseline) screens nothing, the product's (0) screens from the first trial."""
    out = M.run("small", seeds=2, budget=3, fraction=0.25, fix=FIX, rows=_rows(), startups=(4, 0))
    old, new = out["by_startup"][4], out["by_startup"][0]
    assert out["startup"] == 4 and old == out["summary"] and old["screened_out_median"] == 0
    assert new["seeds"] == 2 and new["screened_out_median"] > 0 and new["bench_saved_total"] > old["bench_saved_total"]
