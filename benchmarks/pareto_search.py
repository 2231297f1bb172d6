"""Does the multi-objective search find a better front than the scalar search, or random picks?

A replay on a stub surface (no server): the shipped hfserve knob space (`kb_table.grid_target`,
576 knob sets); output throughput measured on the real server for forge:small
(`benchmarks/data/kb_table_small_throughput.jsonl`, as a ratio over the baseline), and a p90 TPOT
*modelled* from the same knob set (batching on: a step holds every sequence of the batch, so TPOT
grows with the batch size; sdpa and the manual decode loop as in the throughput table's direction).
The two trade off through the batch size, as on a real server.

Three proposers, each 16 trials (the baseline included) and the same keep rule as the loop
(kept: geometric-mean speedup over the best kept so far by more than 3%):
  - `motpe`: `SearchProposer(objectives=...)`, Optuna's multi-objective TPE on both values
    (multivariate, as shipped: `proposers.multi.sampler_options`);
  - `motpe-indep`: the same with independent per-knob models (Optuna's default), for comparison;
  - `tpe`: `SearchProposer()`, TPE on the geometric-mean score (the loop before this change);
  - `tpe-mv`: the same, multivariate, for comparison (is the gain the second objective or the joint model?);
  - `random`: knob sets drawn at random.
The figure of merit is the hypervolume of the front of the *kept* trials (`audit.pareto`'s
definition), against a reference point of throughput 0 and TPOT 2x the worst in the space, over
`--seeds` seeds; also the hypervolume of the front over every scored trial.

Usage: ``python benchmarks/pareto_search.py [--seeds 10] [--trials 16] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import kb_replay as R  # noqa: E402
import kb_table as T  # noqa: E402

from orchestrator.config.goal import parse_goal  # noqa: E402
from orchestrator.core.candidate import Candidate  # noqa: E402
from orchestrator.proposers import get_proposer  # noqa: E402
from orchestrator.review.pareto import non_dominated  # noqa: E402
from orchestrator.store import Store  # noqa: E402

GOAL = parse_goal("maximize throughput and minimize p90 TPOT within 16 trials")
TPUT, TPOT = "throughput:output_throughput", "decode:tpot_ms_p90"
TARGET = T.grid_target()
MIN_GAIN = 0.03


def surface() -> dict[str, dict[str, float] | None]:
    """knob key -> {TPUT, TPOT} (None: the server failed there)."""
    rows = R.load_rows(ROOT / "benchmarks" / "data" / "kb_table_small_throughput.jsonl")
    table = R.Table(rows, "forge:small", "throughput")
    out = {}
    for k in T.knob_grid(TARGET):
        ratio = table.ratio(k)
        batch = int(k["max_batch_size"]) if k["batching"] == "on" else 1
        step = (1.25 if k["attn"] == "sdpa" else 1.0) * (0.85 if k["decode_loop"] == "manual" and k["batching"] == "off" else 1.0)
        out[json.dumps(k, sort_keys=True)] = None if ratio is None else {TPUT: 100.0 * ratio, TPOT: (20.0 + 3.0 * batch) / step}
    return out


def run_one(store: Store, proposer, surf, n: int) -> tuple[list[dict], list[dict]]:
    """(kept points, scored points) of one replayed run."""
    run = store.create_run("r", GOAL.text, GOAL.model_dump(mode="json"), GOAL.digest, {}, {}, "local", "replay")
    knobs = TARGET.baseline_knobs()
    base = surf[json.dumps(knobs, sort_keys=True)]
    best = 1.0
    kept, scored = [dict(base, number=0)], [dict(base, number=0)]
    t = store.create_trial(run.id, 0, commit="", knobs=knobs, rationale="", proposer="baseline")
    store.finish_trial(t.id, "kept", score=1.0, objective=base)
    for i in range(1, n):
        c = proposer.propose(store.list_trials(run.id), TARGET)
        if c is None:
            break
        m = surf[json.dumps({**TARGET.baseline_knobs(), **c.knobs}, sort_keys=True)]
        t = store.create_trial(run.id, i, commit="", knobs=c.knobs, rationale=c.rationale, proposer="search")
        if m is None:
            store.finish_trial(t.id, "failed", error="did not start")
            continue
        score = math.sqrt(m[TPUT] / base[TPUT] * base[TPOT] / m[TPOT])
        status = "kept" if score > best * (1 + MIN_GAIN) else "discarded"
        best = max(best, score) if status == "kept" else best
        store.finish_trial(t.id, status, score=score, objective=m)
        scored.append(dict(m, number=i))
        if status == "kept":
            kept.append(dict(m, number=i))
    return kept, scored


def hypervolume(points: list[dict], ref_tpot: float) -> float:
    front = non_dominated(points, {TPUT: "maximize", TPOT: "minimize"})
    area, prev = 0.0, 0.0
    for p in sorted(front, key=lambda p: p[TPUT]):
        area += (p[TPUT] - prev) * (ref_tpot - p[TPOT])
        prev = p[TPUT]
    return area


class Patched:
    """A proposer whose TPE samplers get `options` on top of the shipped ones (comparison rows only)."""

    def __init__(self, inner, options: dict) -> None:
        self.inner, self.options = inner, options

    def propose(self, history, target):
        import optuna

        real = optuna.samplers.TPESampler
        optuna.samplers.TPESampler = lambda *a, **k: real(*a, **{**k, **self.options})
        try:
            return self.inner.propose(history, target)
        finally:
            optuna.samplers.TPESampler = real


class RandomProposer:
    def __init__(self, seed: int) -> None:
        self.grid = T.knob_grid(TARGET)
        random.Random(seed).shuffle(self.grid)

    def propose(self, history, target):
        return Candidate(knobs=self.grid[len(history)], rationale="random", proposer="random")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    surf = surface()
    ref = 2 * max(v[TPOT] for v in surf.values() if v)
    space = [dict(v, number=-1) for v in surf.values() if v]
    best_hv = hypervolume(space, ref)
    makers = {"motpe": lambda s: get_proposer("search", seed=s, objectives=GOAL.objectives),
              "motpe-indep": lambda s: Patched(get_proposer("search", seed=s, objectives=GOAL.objectives),
                                               {"multivariate": False}),
              "tpe": lambda s: get_proposer("search", seed=s),
              "tpe-mv": lambda s: Patched(get_proposer("search", seed=s), {"multivariate": True}),
              "random": RandomProposer}
    out: dict = {"trials": args.trials, "seeds": args.seeds, "space_hypervolume": best_hv, "proposers": {}}
    for name, make in makers.items():
        hv_kept, hv_all, t0 = [], [], time.monotonic()
        for seed in range(args.seeds):
            store = Store("sqlite://")
            kept, scored = run_one(store, make(seed), surf, args.trials)
            hv_kept.append(hypervolume(kept, ref) / best_hv)
            hv_all.append(hypervolume(scored, ref) / best_hv)
        out["proposers"][name] = {"kept_front_hv": hv_kept, "scored_front_hv": hv_all,
                                  "seconds": round(time.monotonic() - t0, 1)}
        print(f"{name:11s} kept-front hypervolume {statistics.mean(hv_kept):.3f} (median {statistics.median(hv_kept):.3f}), "
              f"scored-front {statistics.mean(hv_all):.3f}, of the whole space's front; "
              f"{time.monotonic() - t0:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
