"""How often the search's first start-up proposals on the H200 target reach the regions that matter.

    python benchmarks/startup_hit.py [--runs 100] [--trials 3]

The real `SearchProposer` on `examples/targets/hfserve_gpu.toml`, per start-up design ("random": TPE's
own uniform draws; "cover": the covering design), seeds 0, 1000, 2000, ... Start-up proposals do not
depend on the scores told back, so the fractions are exact for the start-up trials, not a replay of a
model: what fraction of runs tried the CUDA-graph engine, with batching on, with a batch of 16 or more
(the region of the best known setting, docs/results.md).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]

from orchestrator.proposers.search import SearchProposer  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.targets import load_target  # noqa: E402

GPU = load_target(ROOT / "examples" / "targets" / "hfserve_gpu.toml")
REGIONS = {
    "fast-graphs": lambda k: k["engine"] == "fast-graphs",
    "fast-graphs, batching on": lambda k: k["engine"] == "fast-graphs" and k["batching"] == "on",
    "fast-graphs, batching on, batch >= 16": lambda k: (k["engine"] == "fast-graphs" and k["batching"] == "on"
                                                        and k.get("max_batch_size", 0) >= 16),
    "fast-*, batching on, batch >= 16": lambda k: (k["engine"].startswith("fast") and k["batching"] == "on"
                                                   and k.get("max_batch_size", 0) >= 16),
}


def first_proposals(store: Store, proposer: SearchProposer, n: int, *, candidates: bool = False) -> list:
    """The first n proposals after a baseline on the H200 target, each told a score that ranks nothing:
    their knob sets (or the `Candidate`s, with `candidates`)."""
    run = store.create_run("r", "g", {}, "d", {}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs=GPU.baseline_knobs(), rationale="", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0)
    out = []
    for i in range(1, n + 1):
        c = proposer.propose(store.list_trials(run.id), GPU)
        t = store.create_trial(run.id, i, commit="", knobs=c.knobs, rationale=c.rationale, proposer="search")
        store.finish_trial(t.id, "discarded", score=0.9)
        out.append(c if candidates else c.knobs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--trials", type=int, default=3, help="start-up proposals per run (3: the default start-up)")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    tmp = Path(tempfile.mkdtemp())
    print(f"| start-up design | {' | '.join(REGIONS)} |\n|---|{'---:|' * len(REGIONS)}")
    for design in ("random", "cover"):
        hit: collections.Counter = collections.Counter()
        for s in range(args.runs):
            # walk off: the start-up design alone (with the cost model's steps on, the first proposal is the model's)
            knobs = first_proposals(Store(f"sqlite:///{tmp / f'{design}{s}.db'}"),
                                    SearchProposer(seed=1000 * s, startup=design, walk=False), args.trials)
            for name, inside in REGIONS.items():
                hit[name] += any(inside(k) for k in knobs)
        print(f"| {design} | {' | '.join(f'{hit[n] / args.runs:.0%}' for n in REGIONS)} |")


if __name__ == "__main__":
    main()
