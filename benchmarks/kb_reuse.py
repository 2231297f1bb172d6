"""Does the knowledge base pay off on the NEXT model? Paired cold/warm runs, side by side.

    python benchmarks/kb_reuse.py [--seeds 0 1 2] [--model-a forge:tiny] [--model-b forge:small]
                                  [--misleading] [--scale 0.5] [--json out.json]

1. Optimise model A cold (empty workspace KB); its run writes findings to KB_A.
2. For each seed: optimise model B (another size and shape) cold, then warm with a fresh copy of
   KB_A, same seed, back to back (paired: both see the same machine minutes).
3. `--misleading`: also a warm run whose KB holds only a wrong prior (a knob set that measured
   *slower* than the baseline, labelled as a similar setting), to price a bad prior.

Reported per run: trials until the goal was met and confirmed (`GoalMet`; a run that misses the
goal counts as budget + 1), best score within the budget, wall time. Everything runs the real
loop (`orchestrator.runs.start_run`): servers, gates, bench, on this machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL = "improve throughput by 2.5x without accuracy loss within {budget} trials"


def _target(tmp: Path, model: str) -> Path:
    """The shipped hfserve target with another model (the source path made absolute)."""
    text = (ROOT / "examples" / "targets" / "hfserve.toml").read_text()
    text = text.replace('model = "forge:tiny"', f'model = "{model}"').replace('source = "../hfserve"', f'source = "{ROOT / "examples" / "hfserve"}"')
    path = tmp / f"target-{model.replace(':', '-')}.toml"
    path.write_text(text)
    return path


def run_once(tmp: Path, label: str, model: str, seed: int, kb_dir: Path, scale: float, budget: int) -> dict[str, Any]:
    from orchestrator.config.goal import parse_goal
    from orchestrator.config.workspace import Workspace
    from orchestrator.runs import open_store, start_run

    root = tmp / label
    root.mkdir(parents=True)
    ws = Workspace(root, [f"target={_target(tmp, model)}", f"seed={seed}", f"kb={kb_dir}", f"bench.scale={scale}"])
    t0 = time.perf_counter()
    out = start_run(ws, parse_goal(GOAL.format(budget=budget)))
    wall = time.perf_counter() - t0
    store = open_store(ws)
    run = store.get_run(out.run_id)
    trials = store.list_trials(out.run_id)
    best = store.get_trial(run.best_trial_id) if run.best_trial_id else None
    met = (out.stop_reason or "").startswith("GoalMet")
    warm = [e.data for e in store.events(out.run_id, kind="kb.warm_start")]
    res = {"label": label, "model": model, "seed": seed, "stop": out.stop_reason, "goal_met": met,
           "trials": len(trials), "trials_to_goal": len(trials) if met else budget + 1,
           "best_score": round(best.score, 3) if best and best.score else 1.0, "wall_s": round(wall, 1),
           "warm_knobs": warm[0]["knobs"] if warm else [],
           "scores": [(t.number, t.status, None if t.score is None else round(t.score, 3)) for t in trials]}
    print(json.dumps(res), flush=True)
    return res


def _misleading_kb(src_kb: Path, dst: Path) -> Path:
    """A KB whose only finding is A's knob set turned into a loser (batching off, bf16, 1 thread)."""
    from orchestrator.knowledge.entries import parse_entry, render

    dst.mkdir(parents=True)
    for f in (src_kb / "findings").glob("finding-hfserve-*.md"):
        e = parse_entry(f)
        if not e.meta.get("knobs"):
            continue
        meta = dict(e.meta)
        meta["knobs"] = {**meta["knobs"], "batching": "off", "dtype": "bfloat16", "threads": 1, "decode_loop": "generate"}
        meta["id"] = "finding-hfserve-misleading"
        (dst / "findings").mkdir(exist_ok=True)
        (dst / "findings" / "finding-hfserve-misleading.md").write_text(render(meta, e.body))
        break
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--model-a", default="forge:tiny")
    ap.add_argument("--model-b", default="forge:small")
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("--misleading", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kb-a", type=Path, help="Use this KB (written by an earlier model-A run) instead of running A cold.")
    ap.add_argument("--arms", nargs="+", default=["cold", "warm"], choices=["cold", "warm"],
                    help="Which B arms to run (to split pairs over processes on a crowded machine).")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kb_reuse_"))
    results: list[dict[str, Any]] = []
    kb_a = tmp / "kb_a"
    if args.kb_a:
        shutil.copytree(args.kb_a, kb_a)
    else:
        results.append(run_once(tmp, "A-cold", args.model_a, args.seeds[0], kb_a, args.scale, args.budget))
    for seed in args.seeds:
        if "cold" in args.arms:
            results.append(run_once(tmp, f"B-cold-s{seed}", args.model_b, seed, tmp / f"kb_cold_s{seed}", args.scale, args.budget))
        if "warm" in args.arms:
            kb_warm = tmp / f"kb_warm_s{seed}"
            shutil.copytree(kb_a, kb_warm)
            results.append(run_once(tmp, f"B-warm-s{seed}", args.model_b, seed, kb_warm, args.scale, args.budget))
        if args.misleading:
            kb_bad = _misleading_kb(kb_a, tmp / f"kb_bad_s{seed}")
            results.append(run_once(tmp, f"B-misled-s{seed}", args.model_b, seed, kb_bad, args.scale, args.budget))
    summary: dict[str, Any] = {}
    for arm in ("cold", "warm", "misled"):
        rows = [r for r in results if r["label"].startswith(f"B-{arm}")]
        if rows:
            summary[arm] = {"pairs": len(rows), "median_trials_to_goal": statistics.median(r["trials_to_goal"] for r in rows),
                            "median_best_score": statistics.median(r["best_score"] for r in rows),
                            "goal_met": sum(r["goal_met"] for r in rows),
                            "median_wall_s": statistics.median(r["wall_s"] for r in rows)}
    print(json.dumps({"summary": summary}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "summary": summary}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
