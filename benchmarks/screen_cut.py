"""The screen's early stop measured on the CPU: a screened-out candidate's bench seconds with and without it.

    python benchmarks/screen_cut.py [--pairs 5] [--floors] [--profile cpu|h200] [--json out.json]

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

`--floors`: the run also holds speed-of-light floors (`infergoal floors`; a tiny Llama shape's config.json
and ceilings solved so that the decode's TPOT floor and the burst's throughput ceiling stand to the
baseline as the H200's do in `benchmarks/gpu/results/sol.json`: 3.41 / 37.7 ms and 3391 / 27.1 tok/s). The
screen then caps the objectives not measured yet at the speed-of-light gate's edge (`verdict.speedup_caps`),
measures the burst first (`fidelity.short_order`) and can stop it, leaving the decode not run.
`--profile h200`: the H200 warm run's (2026-12-03d) knob sets at a tenth of their time: the baseline one at a
time at 3.77 ms a token (TTFT 4.5 ms); the good one (#4: batching on, 16 at once) 0.47 ms; slow-2 (#2,
fast-eager, batching off) one at a time at 1.8 ms; slow-3 (#3, hf-manual, batching on but slow) two at a
time at 4.19 ms. Reported for each slow one: bench seconds cut / uncut and whether both ended the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from orchestrator.bench.saturation import SaturationPolicy  # noqa: E402
from orchestrator.bench.scenarios import load_scenarios_file  # noqa: E402
from orchestrator.config.goal import load_goal  # noqa: E402
from orchestrator.core.candidate import Candidate  # noqa: E402
from orchestrator.hosts.local import LocalHost  # noqa: E402
from orchestrator.hosts.measure import TrustPolicy  # noqa: E402
from orchestrator.loop.controller import Controller  # noqa: E402
from orchestrator.proposers import SearchProposer  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.targets import load_target  # noqa: E402
from orchestrator.trial.context import TrialContext  # noqa: E402
from orchestrator.trial.fidelity import is_screened  # noqa: E402

SERVER_DIR = ROOT / "tests" / "bench"
PROFILES = {
    "cpu": {"ttft_ms": 2.0, "base": {"slots": 1, "tpot_ms": 1.0}, "good": {"slots": 16, "tpot_ms": 0.5},
            "slow": [{"slots": 1, "tpot_ms": 0.75}]},
    "h200": {"ttft_ms": 4.5, "base": {"slots": 1, "tpot_ms": 3.77}, "good": {"slots": 16, "tpot_ms": 0.47},
             "slow": [{"slots": 1, "tpot_ms": 1.8}, {"slots": 2, "tpot_ms": 4.19}]},
}
# The H200's floors over its baseline (sol.json; the warm run's baseline #0): what --floors reproduces here.
H200_TPOT_FLOOR_SHARE = 3.4118 / 37.712
H200_CEILING_OVER_BASE = 3391.25 / 27.067
CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256, "num_attention_heads": 4}
TARGET = f'''
name = "load"
engine = "fake"
model = "forge:tiny"
served_model_name = "fake"
source = "{SERVER_DIR}"
ready_timeout_s = 30
launch = """{{{{ python }}}} {{{{ source }}}}/loadserver.py --port {{{{ port }}}} --slots {{{{ slots }}}} --ttft-ms TTFT --tpot-ms {{{{ tpot_ms }}}}"""
[knobs.slots]
type = "int"
low = 1
high = 16
default = BASE_SLOTS
[knobs.tpot_ms]
type = "float"
low = 0.1
high = 10.0
default = BASE_TPOT
'''


def floors_record(profile: dict, scenarios: dict) -> dict:
    """A speed-of-light record (`infergoal floors`) for CONFIG whose decode TPOT floor and burst throughput ceiling
    stand to this profile's baseline as the H200's stand to its own: copy rate from the TPOT floor, matrix rate
    from the ceiling (prefill-bound, as the H200's burst is)."""
    from gates import plausible

    m = plausible.model_numbers(CONFIG)
    dec, thr = scenarios["decode"], scenarios["throughput"]
    base = profile["base"]
    tpot_floor_s = base["tpot_ms"] * H200_TPOT_FLOOR_SHARE / 1000
    copy = (m["weight_bytes"] + (dec.prompt_tokens + dec.output_tokens / 2) * m["kv_bytes_per_token"]) / tpot_floor_s
    per_request_s = (profile["ttft_ms"] + (thr.output_tokens - 1) * base["tpot_ms"]) / 1000  # one at a time
    ceiling = H200_CEILING_OVER_BASE * thr.output_tokens / per_request_s
    t = thr.num_requests * thr.output_tokens / ceiling
    flops = thr.num_requests * (2 * m["matmul_params"] * thr.prompt_tokens
                                + 2 * m["layers"] * thr.prompt_tokens ** 2 * m["d_attn"]) / t
    return {"floors": {}, "ceilings": {"copy_bytes_per_s": copy, "bf16_flops_per_s": flops}, "model": m, "source": "screen_cut.py"}


class Steps:
    """The good one, then the slow ones, screened by the search's own rule; `bar=False`: no `stop_bar`, so never
    stopped early."""

    name = "steps"

    def __init__(self, bar: bool, steps: list[dict]) -> None:
        self.search, self.steps = SearchProposer(seed=0), steps
        if bar:
            self.stop_bar = self.search.stop_bar

    def should_stop_early(self, *a, **kw):  # noqa: ANN002, ANN003, ANN201
        return self.search.should_stop_early(*a, **kw)

    def propose(self, history, target):  # noqa: ANN001, ANN201
        done = sum(1 for t in history if t.number > 0)
        return Candidate(knobs=dict(self.steps[done]), rationale=f"step {done + 1}", proposer=self.name) if done < len(self.steps) else None


def run_once(tmp: Path, cut: bool, profile: dict, floors: bool) -> list[dict]:
    """One run (the good knob set, then the slow ones); a row per slow one."""
    import json

    Controller._confirm_best = lambda self, reason: reason  # no paired rounds at the stop: not what is measured
    (tmp / "target.toml").write_text(TARGET.replace("TTFT", str(profile["ttft_ms"])).replace("BASE_SLOTS", str(profile["base"]["slots"]))
                                     .replace("BASE_TPOT", str(profile["base"]["tpot_ms"])))
    store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
    goal = load_goal(ROOT / "benchmarks" / "gpu" / "goal_best.toml")
    scenarios = load_scenarios_file(ROOT / "benchmarks" / "gpu" / "scenarios.toml")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "steps")
    if floors:
        (tmp / "config.json").write_text(json.dumps(CONFIG))
        store.add_event(run.id, "speed_of_light", "floors", data=floors_record(profile, scenarios))
    ctx = TrialContext(run_id=run.id, goal=goal, target=load_target(tmp / "target.toml"), host=LocalHost(tmp / "state", standby=False),
                       store=store, model_dir=tmp, reference_dir=tmp, run_dir=tmp / "run", source_dir=SERVER_DIR,
                       scenarios=scenarios, accuracy_gate=False, integrity_gate=False,
                       trust=TrustPolicy(probe_s=0.0, settle_s=0.0, saturation=SaturationPolicy(max_client_cpu=float("inf"))))
    Controller(ctx, Steps(cut, [profile["good"], *profile["slow"]]), screen_fraction=0.25).run()
    trials = store.list_trials(run.id)
    good = next(t for t in trials if t.knobs == profile["good"])
    rows = []
    for i, knobs in enumerate(profile["slow"]):
        slow = next(t for t in trials if t.knobs == knobs)
        ms = {(m.scenario, m.metric): m.value for m in store.measurements(slow.id)}
        ev = [e.data for e in store.events(run.id, kind="screen") if e.trial_id == slow.id]
        rows.append({"cut": cut, "floors": floors, "slow": i, "knobs": knobs, "status": slow.status, "screened": is_screened(slow),
                     "score": slow.score, "good": good.status, "good_score": good.score, "bench_s": slow.timings.get("bench"),
                     "burst_s": ms.get(("throughput@0.25", "duration_s")), "decode_s": ms.get(("decode@0.25", "duration_s")),
                     "stopped": [n for n in ("decode", "throughput") if ms.get((f"{n}@0.25", "stopped_early"))],
                     "not_run": sorted((ev[-1].get("not_run") or {}) if ev else {}), "error": slow.error})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--floors", action="store_true", help="the run holds H200-proportioned speed-of-light floors")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    a = ap.parse_args()
    profile, rows = PROFILES[a.profile], []
    for i in range(a.pairs):
        for cut in ((True, False) if i % 2 == 0 else (False, True)):
            with tempfile.TemporaryDirectory() as d:
                got = run_once(Path(d), cut, profile, a.floors)
            rows += got
            for r in got:
                print(f"pair {i} {'cut  ' if cut else 'uncut'}: slow-{r['slow']} {r['status']}{' (screened)' if r['screened'] else ''} "
                      f"score {r['score']:.3f}, bench {r['bench_s']:.3f} s, burst {r['burst_s'] or 0:.3f} s, decode {r['decode_s'] or 0:.3f} s"
                      f"{' stopped ' + ','.join(r['stopped']) if r['stopped'] else ''}{' not run ' + ','.join(r['not_run']) if r['not_run'] else ''}"
                      f"; good {r['good']} {r['good_score']:.2f}x", flush=True)
    same = True
    summary = {}
    for k in range(len(profile["slow"])):
        mine = [r for r in rows if r["slow"] == k]
        med = {c: statistics.median(r["bench_s"] for r in mine if r["cut"] == c) for c in (True, False)}
        ended = {(r["status"], r["screened"]) for r in mine} | {("good", r["good"]) for r in mine}
        same = same and len({(r["status"], r["screened"]) for r in mine}) == 1 and len({r["good"] for r in mine}) == 1
        summary[k] = {"median_bench_s": med, "ended": sorted(map(str, ended))}
        print(f"slow-{k} {profile['slow'][k]}: bench median {med[True]:.3f} s cut vs {med[False]:.3f} s uncut "
              f"(saved {med[False] - med[True]:.3f} s, ratio {med[True] / med[False]:.2f}); ended {sorted(ended)}")
    print(f"every pair ended the same, cut or uncut: {same}")
    print("example reason (cut):", next(r["error"] for r in rows if r["cut"]))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "summary": summary, "floors": a.floors, "profile": a.profile}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
