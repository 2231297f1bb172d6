"""Tables and the best-so-far plot of a GPU run, from its SQLite database (runs here, no GPU).

    python benchmarks/gpu/plot.py benchmarks/gpu/results/h200_gated_run.db --sol benchmarks/gpu/results/sol.json \
        --png docs/gpu_best_so_far.png

Prints each trial (status, score, per-scenario values) and, for the baseline and the best kept
trial, each scenario's value as a speedup and as a percentage of its speed-of-light floor.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

FLOOR = {"prefill:ttft_ms_p50": ("prefill_ttft_ms", "lower"), "decode:tpot_ms_p50": ("decode_tpot_ms", "lower"),
         "throughput:output_throughput": ("throughput_tok_s", "higher")}


def trials(db: str, run_id: int | None) -> list[dict]:
    con = sqlite3.connect(db)
    rid = run_id or con.execute("select max(id) from runs").fetchone()[0]
    rows = con.execute("select number, status, score, knobs_json, objective_json, timings_json from trials "
                       "where run_id=? order by number", (rid,)).fetchall()
    return [{"n": r[0], "status": r[1], "score": r[2], "knobs": json.loads(r[3] or "{}"),
             "obj": json.loads(r[4] or "{}"), "secs": (json.loads(r[5] or "{}") or {}).get("trial", 0.0)} for r in rows]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--run", type=int, default=None)
    ap.add_argument("--sol", default="")
    ap.add_argument("--png", default="")
    args = ap.parse_args(argv)
    ts = trials(args.db, args.run)
    print("| # | status | score | TTFT p50 ms (A) | TPOT p50 ms (B) | out tok/s (C) | s | knobs |")
    print("|---|---|---|---|---|---|---|---|")
    for t in ts:
        o = t["obj"]
        vals = [f"{o[k]:.1f}" if k in o else "–" for k in FLOOR]
        score = f"{t['score']:.3f}×" if t["score"] else "–"
        print(f"| {t['n']} | {t['status']} | {score} | {' | '.join(vals)} | {t['secs']:.0f} | "
              f"{json.dumps(t['knobs'], sort_keys=True)} |")
    print(f"\ntrials: {len(ts)}, trial time: {sum(t['secs'] for t in ts):.0f} s")
    kept = [t for t in ts if t["status"] == "kept" and t["score"]]
    if args.sol and kept:
        floors = json.loads(Path(args.sol).read_text())["floors"]
        base, best = ts[0], max(kept, key=lambda t: t["score"])
        print(f"\n| scenario | floor | baseline | % of SOL | best (#{best['n']}) | speedup | % of SOL |")
        print("|---|---|---|---|---|---|---|")
        for key, (fk, d) in FLOOR.items():
            f, b, c = floors[fk], base["obj"][key], best["obj"][key]
            pct = (lambda v, f=f: 100 * f / v) if d == "lower" else (lambda v, f=f: 100 * v / f)
            sp = b / c if d == "lower" else c / b
            print(f"| {key} | {f:.2f} | {b:.2f} | {pct(b):.0f}% | {c:.2f} | {sp:.2f}× | {pct(c):.0f}% |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs, best_so_far, b = [], [], 0.0
        for t in ts:
            if t["status"] == "kept" and t["score"]:
                b = max(b, t["score"])
            xs.append(t["n"])
            best_so_far.append(b or None)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.step(xs, best_so_far, where="post", label="best kept (geomean speedup)")
        ax.scatter([t["n"] for t in ts if t["score"]], [t["score"] for t in ts if t["score"]], s=14,
                   color="gray", label="each measured trial")
        ax.axhline(10, color="red", ls="--", lw=0.8, label="target 10×")
        ax.set_yscale("log")
        ax.set_xlabel("trial")
        ax.set_ylabel("speedup over baseline")
        ax.set_title("H200, Mistral-7B shape: the loop's best so far")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
