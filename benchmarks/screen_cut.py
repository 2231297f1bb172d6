"""The screen's early stop measured on the CPU: a screened-out candidate's bench seconds with and without it.

    python benchmarks/screen_cut.py [--pairs 5] [--json out.json]

The H200 goal's shape on the torch-free load server (`tests/bench/loadserver.py`, `--slots` requests at
once, `--tpot-ms` a token): `benchmarks/gpu/goal_best.toml`'s objectives (TPOT p50 on `decode`, output
throughput on `throughput`) on `benchmarks/gpu/scenarios.toml`'s scenarios unchanged (decode 8 x 64 tokens
at c=1; throughput a one-wave burst of 16 x 32 tokens, 4 warm-up). Knob sets, in ms a token:
- the baseline: one request at a time (slots 1), 1.0 ms (the H200's naive baseline: one at a time);
- a good candidate: slots 16, 0.5 ms (batching on), kept: it sets the bar (its score less the margin);
- the slow candidate: slots 1, 0.75 ms (batching off), screened out, as the H200's slow candidates.
Each pair runs the real loop twice on fresh servers (Controller, the local host, the real bench, the
search's pruner; gates off, no paired rounds at the stop): *cut* (the product: the search names its bar)
and *uncut* (the same proposer without `stop_bar`, so no short pass is stopped), alternating which goes
first. Reported per run, for the slow candidate: its bench seconds (`timings["bench"]`, the short pass),
its burst's measured seconds, how it ended; and the median ratio cut / uncut.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.bench.saturation import SaturationPolicy  # noqa: E402
from orchestrator.bench.scenarios import load_scenarios_file  # noqa: E402
from orchestrator.candidate import Candidate  # noqa: E402
from orchestrator.controller import Controller  # noqa: E402
from orchestrator.fidelity import is_screened  # noqa: E402
from orchestrator.goal import load_goal  # noqa: E402
from orchestrator.hosts.local import LocalHost  # noqa: E402
from orchestrator.measure import TrustPolicy  # noqa: E402
from orchestrator.proposers import SearchProposer  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.targets import load_target  # noqa: E402
from orchestrator.trial import TrialContext  # noqa: E402

SERVER_DIR = ROOT / "tests" / "bench"
BASE, GOOD, SLOW = {"slots": 1, "tpot_ms": 1.0}, {"slots": 16, "tpot_ms": 0.5}, {"slots": 1, "tpot_ms": 0.75}
TARGET = f'''
name = "load"
engine = "fake"
model = "forge:tiny"
served_model_name = "fake"
source = "{SERVER_DIR}"
ready_timeout_s = 30
launch = """{{{{ python }}}} {{{{ source }}}}/loadserver.py --port {{{{ port }}}} --slots {{{{ slots }}}} --ttft-ms 2 --tpot-ms {{{{ tpot_ms }}}}"""
[knobs.slots]
type = "categorical"
choices = [1, 16]
default = 1
[knobs.tpot_ms]
type = "categorical"
choices = [1.0, 0.5, 0.75]
default = 1.0
'''


class Steps:
    """GOOD then SLOW, screened by the search's own rule; `bar=False`: no `stop_bar`, so never stopped early."""

    name = "steps"

    def __init__(self, bar: bool) -> None:
        self.search = SearchProposer(seed=0)
        if bar:
            self.stop_bar = self.search.stop_bar

    def should_stop_early(self, *a, **kw):  # noqa: ANN002, ANN003, ANN201
        return self.search.should_stop_early(*a, **kw)

    def propose(self, history, target):  # noqa: ANN001, ANN201
        done = sum(1 for t in history if t.number > 0)
        return Candidate(knobs=dict((GOOD, SLOW)[done]), rationale=f"step {done + 1}", proposer=self.name) if done < 2 else None


def run_once(tmp: Path, cut: bool) -> dict:
    Controller._confirm_best = lambda self, reason: reason  # no paired rounds at the stop: not what is measured
    (tmp / "target.toml").write_text(TARGET)
    store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
    goal = load_goal(ROOT / "benchmarks" / "gpu" / "goal_best.toml")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "steps")
    ctx = TrialContext(run_id=run.id, goal=goal, target=load_target(tmp / "target.toml"), host=LocalHost(tmp / "state", standby=False),
                       store=store, model_dir=tmp, reference_dir=tmp, run_dir=tmp / "run", source_dir=SERVER_DIR,
                       scenarios=load_scenarios_file(ROOT / "benchmarks" / "gpu" / "scenarios.toml"),
                       accuracy_gate=False, integrity_gate=False,
                       trust=TrustPolicy(probe_s=0.0, settle_s=0.0, saturation=SaturationPolicy(max_client_cpu=float("inf"))))
    Controller(ctx, Steps(cut), screen_fraction=0.25).run()
    slow = next(t for t in store.list_trials(run.id) if t.knobs == SLOW)
    burst = {m.metric: m.value for m in store.measurements(slow.id) if m.scenario == "throughput@0.25"}
    good = next(t for t in store.list_trials(run.id) if t.knobs == GOOD)
    return {"cut": cut, "status": slow.status, "screened": is_screened(slow), "score": slow.score, "good": good.status,
            "good_score": good.score, "bench_s": slow.timings.get("bench"), "burst_s": burst.get("duration_s"),
            "stopped": bool(burst.get("stopped_early")), "error": slow.error}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    for i in range(a.pairs):
        for cut in ((True, False) if i % 2 == 0 else (False, True)):
            with tempfile.TemporaryDirectory() as d:
                r = run_once(Path(d), cut)
            rows.append(r)
            print(f"pair {i} {'cut  ' if cut else 'uncut'}: slow {r['status']}{' (screened)' if r['screened'] else ''} "
                  f"score {r['score']:.3f}, bench {r['bench_s']:.3f} s, burst {r['burst_s']:.3f} s"
                  f"{' stopped' if r['stopped'] else ''}; good {r['good']} {r['good_score']:.2f}x", flush=True)
    med = {k: statistics.median(r["bench_s"] for r in rows if r["cut"] == k) for k in (True, False)}
    burst = {k: statistics.median(r["burst_s"] for r in rows if r["cut"] == k) for k in (True, False)}
    same = all(r["screened"] and r["status"] == "discarded" for r in rows)
    print(f"slow candidate's bench: median {med[True]:.3f} s cut vs {med[False]:.3f} s uncut (ratio {med[True] / med[False]:.2f}); "
          f"its burst {burst[True]:.3f} vs {burst[False]:.3f} s; every run screened it out: {same}")
    print("example reason (cut):", next(r["error"] for r in rows if r["cut"]))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "median_bench_s": {"cut": med[True], "uncut": med[False]}}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
