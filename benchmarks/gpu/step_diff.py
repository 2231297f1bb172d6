"""Per-step seconds of two runs side by side, trial by trial: what one way of running adds over another.

    python benchmarks/gpu/step_diff.py A_DB B_DB [--run-id-a N] [--run-id-b N] [--json out.json]

Made for a run of the H200 loop through an SSH host on the GPU machine's loopback, B,
against the same goal run on the local host, A): each trial's `timings_json` steps (sync, deploy,
gates, bench, teardown, trial; `deploy` includes `sync`; a step a trial did not take counts 0), matched by trial number (the
same goal, seed and proposer give the same sequence until the runs' measurements differ; the
knobs column shows where they part), then the median of each step over the trials both runs have
after the baseline, and B minus A. The first trial of B (`trial.host` event) also says where the
trials ran (host, model_hash: `stat:...` = the host's own copy of the model was used in place).
The databases are read from copies.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

STEPS = ("sync", "deploy", "gates", "bench", "teardown", "trial")


def read(db: Path, run_id: int | None) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """(trial number -> {knobs, proposer, steps}, the first trial.host facts) of one run (default: the last)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run.db"
        shutil.copy(db, copy)
        con = sqlite3.connect(copy)
        if run_id is None:
            run_id = con.execute("select max(id) from runs").fetchone()[0]
        rows = con.execute("select number, knobs_json, proposer, timings_json from trials where run_id = ? order by number",
                           (run_id,)).fetchall()
        host = con.execute("select data_json from events where run_id = ? and kind = 'trial.host' order by id limit 1",
                           (run_id,)).fetchone()
        con.close()
    trials = {n: {"knobs": json.loads(k or "{}"), "proposer": p or "", "steps": json.loads(t or "{}")} for n, k, p, t in rows}
    return trials, json.loads(host[0]) if host and host[0] else {}


def compare(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> dict[str, Any]:
    common = sorted(set(a) & set(b))
    rows = [{"trial": n, "knobs_a": a[n]["knobs"], "knobs_b": b[n]["knobs"],
             "a": {s: a[n]["steps"].get(s, 0.0) for s in STEPS}, "b": {s: b[n]["steps"].get(s, 0.0) for s in STEPS}}
            for n in common]
    after = [r for r in rows if r["trial"] > 0]
    median = {side: {s: statistics.median(r[side][s] for r in after) if after else None for s in STEPS} for side in ("a", "b")}
    added = {s: (median["b"][s] - median["a"][s]) if after else None for s in STEPS}
    return {"rows": rows, "median_after_baseline": median, "added_b_minus_a": added, "trials_compared": len(after)}


def _knobs(k: dict[str, Any]) -> str:
    return ",".join(f"{n}={v}" for n, v in sorted(k.items())) or "(defaults)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="the reference run's database (e.g. the local host)")
    p.add_argument("b", type=Path, help="the run to compare (e.g. the SSH host)")
    p.add_argument("--run-id-a", type=int)
    p.add_argument("--run-id-b", type=int)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    a, host_a = read(args.a, args.run_id_a)
    b, host_b = read(args.b, args.run_id_b)
    res = compare(a, b)
    for name, host in (("A", host_a), ("B", host_b)):
        print(f"{name}: {host.get('host', 'local')} model_hash={host.get('model_hash', '-')} sync={host.get('sync', '-')}")
    print(f"{'#':>3s} " + " ".join(f"{s:>17s}" for s in STEPS) + "   (A / B seconds)  knobs A | B where they differ")
    for r in res["rows"]:
        cells = " ".join(f"{r['a'][s]:8.2f}/{r['b'][s]:<8.2f}" for s in STEPS)
        same = r["knobs_a"] == r["knobs_b"]
        print(f"{r['trial']:3d} {cells}  {_knobs(r['knobs_a'])}" + ("" if same else f" | {_knobs(r['knobs_b'])}"))
    if res["trials_compared"]:
        ma, mb, d = res["median_after_baseline"]["a"], res["median_after_baseline"]["b"], res["added_b_minus_a"]
        print(f"median over {res['trials_compared']} trials after the baseline:")
        print(f"{'step':10s} {'A':>8s} {'B':>8s} {'B-A':>8s}")
        for s in STEPS:
            print(f"{s:10s} {ma[s]:8.2f} {mb[s]:8.2f} {d[s]:+8.2f}")
    extra = sorted(set(a) ^ set(b))
    if extra:
        print(f"trials only in one run: {extra}")
    if args.json:
        args.json.write_text(json.dumps({**res, "host_a": host_a, "host_b": host_b}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
