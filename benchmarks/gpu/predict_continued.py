"""Predict a run's trial times had its full bench continued the short pass (multi-fidelity).

    python benchmarks/gpu/predict_continued.py benchmarks/gpu/results/h200_ttb_big_7b_2026-12-02c.db \
        --scenarios benchmarks/gpu/scenarios.toml [--json out.json]

Reads a run database whose search trials had a short pass (`screen` events) and their per-step
timings, and replays each trial's time under the continued full bench (`orchestrator.trial.fidelity`,
`orchestrator.bench.passes`), on the same proposals (a screened-out trial would have told TPE its
short score instead: later proposals may differ, which this does not model):
- screened out (its short score under the bar: the best kept score so far x (1 - the screen's
  margin), the product's ThresholdPruner with start-up 0): the trial less its gates, its audit and
  its bench after the short pass;
- passed: the trial less, per goal scenario, the requests the short pass already measured, at that
  scenario's measured pace in the trial's own full bench (its first repeat's `duration_s` x the short
  pass's share of its requests: a one-wave scenario's whole duration). Not counted: the ~0.15 s of
  host probes a skipped bench call also saves. Re-measures (whole scenarios) are unchanged.
Baselines, sentinels and paired rounds are unchanged. Prints per trial old -> new and the median
trial over the finished trials, as `time_to_best.py` computes it (`timings.trial`).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
from pathlib import Path
from typing import Any

from orchestrator.bench.scenarios import load_scenarios_file  # noqa: E402
from orchestrator.trial.fidelity import continues, short_scenario  # noqa: E402


def predict(db: Path, scenarios: dict[str, Any]) -> dict[str, Any]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    trials = con.execute("select id, number, proposer, status, score, timings_json from trials order by number").fetchall()
    screens = {tid: json.loads(d) for tid, d in con.execute("select trial_id, data_json from events where kind='screen'")}
    dur: dict[int, dict[str, float]] = {}
    for tid, sc, rep, v in con.execute("select trial_id, scenario, repeat, value from measurements where metric='duration_s'"):
        if rep == 0:
            dur.setdefault(tid, {})[sc] = v
    rows, best = [], 1.0
    for tid, number, proposer, status, score, tj in trials:
        t = json.loads(tj) if tj else {}
        if "trial" not in t:
            continue  # not finished (an interrupted paired round)
        row: dict[str, Any] = {"number": number, "proposer": proposer, "status": status, "old_s": round(t["trial"], 2),
                               "old_bench_s": round(t.get("bench", 0.0), 2)}
        s = screens.get(tid)
        new, bench = t["trial"], t.get("bench", 0.0)
        if s and not s.get("skipped"):
            bar = best * (1 - s["margin"])
            row.update(short_score=round(s["score"], 3), bar=round(bar, 3))
            if s["score"] < bar:
                new = t["trial"] - t.get("gates", 0.0) - t.get("audit", 0.0) - (t["bench"] - t["screen"])
                bench = t["screen"]
                row["outcome"] = "screened out: no gates, no audit, no full bench"
            else:
                saved = {}
                for name, d in dur.get(tid, {}).items():
                    if "@" in name or name not in scenarios:
                        continue
                    short = short_scenario(scenarios[name], s["fraction"], continued=continues(name))
                    if short.part is not None:
                        saved[name] = round(d * short.measured_requests / scenarios[name].num_requests, 2)
                new, bench = t["trial"] - sum(saved.values()), t["bench"] - sum(saved.values())
                row.update(outcome="passed: the full bench continues the short pass", not_rerun_s=saved)
        row["new_s"], row["new_bench_s"] = round(new, 2), round(bench, 2)
        rows.append(row)
        if status == "kept" and score is not None and proposer == "search" and not row.get("outcome", "").startswith("screened"):
            best = max(best, score)  # the bar follows the best kept search trial (the baseline's 1.0 first)
    old = [r["old_s"] for r in rows]
    new = [r["new_s"] for r in rows]
    return {"db": str(db), "trials": rows, "median_trial_old_s": round(statistics.median(old), 2) if old else None,
            "median_trial_new_s": round(statistics.median(new), 2) if new else None,
            "search_median_old_s": round(statistics.median([r["old_s"] for r in rows if r["proposer"] == "search"]), 2),
            "search_median_new_s": round(statistics.median([r["new_s"] for r in rows if r["proposer"] == "search"]), 2),
            "median_bench_old_s": round(statistics.median(r["old_bench_s"] for r in rows), 2) if rows else None,
            "median_bench_new_s": round(statistics.median(r["new_bench_s"] for r in rows), 2) if rows else None,
            "sum_old_s": round(sum(old), 1), "sum_new_s": round(sum(new), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", type=Path, nargs="+")
    ap.add_argument("--scenarios", type=Path, default=Path(__file__).resolve().parent / "scenarios.toml")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    scenarios = load_scenarios_file(args.scenarios)
    out = [predict(db, scenarios) for db in args.db]
    for o in out:
        print(o["db"])
        for r in o["trials"]:
            print(f"  #{r['number']} {r['proposer']:8} {r['old_s']:7.1f} -> {r['new_s']:7.1f} s (bench {r['old_bench_s']:5.1f} -> "
                  f"{r['new_bench_s']:5.1f})  "
                  f"{r.get('short_score', ''):>6} {r.get('bar', ''):>6}  {r.get('outcome', '')} {r.get('not_rerun_s', '')}")
        print(f"  median trial {o['median_trial_old_s']} -> {o['median_trial_new_s']} s (search trials "
              f"{o['search_median_old_s']} -> {o['search_median_new_s']} s); median bench {o['median_bench_old_s']} -> "
              f"{o['median_bench_new_s']} s; all trials {o['sum_old_s']} -> {o['sum_new_s']} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
