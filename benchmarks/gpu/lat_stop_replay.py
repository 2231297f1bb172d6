"""The latency bound and the burst-first short pass, replayed on the H200 runs' stored short passes.

    python benchmarks/gpu/lat_stop_replay.py [DB ...] [--json out.json]

For every search trial that had a short pass (a `screen` event) in the given runs (default: every
benchmarks/gpu/results/h200_*.db with floors and screens), the product's own rule (`fidelity.Screen.plan`,
`fidelity.short_order`, `verdict.speedup_caps` on the run's stored floors, the screen's stored bar and
the newest baseline's values) is asked what it would have done with the numbers that trial measured:
- the order of the short pass, and per scenario: a stop rule, or not run (its outcome certain);
- when the burst's rule stops it: at possible tokens / the rule's floor, if the burst took longer
  (measured; where the old stop cut it, its length estimated as the screen did: tokens at the pace they came);
- when the decode's TPOT p50 rule stops it: its 2 requests one at a time, tokens every TPOT p50 after a
  TTFT p50 (the measured ones), the bound (numpy's median of the two requests' (last token so far -
  first) / 63) checked at every token;
- bench seconds: each scenario's window (`measure.host` wall_s: warm-up + measured) with its measured part
  replaced by the replayed one, a scenario not run costing 0, plus the rest of the short pass as measured.
  A server's first requests are slower (cold): the scenario measured first pays it. `cold` is the decode
  window's excess over its warm-up request's TTFT + 63 TPOT; the conservative estimate moves it onto the
  burst when the burst goes first, the optimistic one leaves it where it was (decode's, then not run).
Caps only where the run's floors were its model's (its speed-of-light gate ran: the 7B runs; the 2B runs
held the 7B's floors, which the product does not apply to another shape). Checked: a trial the replay stops was screened out in the run (the bound is exact: it must never stop a
trial that passed), and a trial that passed gets no stop. Models are stated; only the rule is the product's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import numpy as np  # noqa: E402

from gates import plausible  # noqa: E402
from orchestrator.bench.scenarios import load_scenarios_file  # noqa: E402
from orchestrator.config.goal import GoalSpec  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.trial import verdict  # noqa: E402
from orchestrator.trial.context import objective_label  # noqa: E402
from orchestrator.trial.fidelity import Screen, is_screened, short_order, short_scenario, throughput_floor  # noqa: E402


def decode_stop_s(rule, ttft_ms: float, tpot_ms: float, n: int, tokens: int) -> float | None:
    """Seconds into the decode's measured part at which `rule` (one latency key) stops it, or None."""
    (key, base), = rule.speedups
    if key != "tpot_ms_p50":
        return None
    limit = base / rule.below  # stopped once the bound is over this
    t, bounds = 0.0, [0.0] * n
    for i in range(n):  # one at a time
        first = t + ttft_ms / 1000
        for k in range(1, tokens + 1):
            now = first + (k - 1) * tpot_ms / 1000
            bounds[i] = (now - first) * 1000 / (tokens - 1)
            if float(np.percentile(bounds, 50, method="linear")) > limit:
                return now
        t = first + (tokens - 1) * tpot_ms / 1000
    return None


def bar_of(message: str, t, trials, margin: float) -> float | None:
    """The screen's bar where the event did not store it (runs before it did): said in a screened-out reason, or
    what the search's `stop_bar` gives on the trials before it (the product's bar, `fidelity.screen_for`)."""
    import re

    from orchestrator.core.roles import NOT_SEARCH
    from orchestrator.proposers.search import SearchProposer
    from orchestrator.trial.fidelity import KNOWN_NOISE_STARTUP

    if m := re.search(r"a bar of ([0-9.]+)x", message):
        return float(m.group(1))
    seen = [x for x in trials if x.number < t.number and x.proposer not in NOT_SEARCH]
    return SearchProposer(seed=0).stop_bar(seen, margin, startup=KNOWN_NOISE_STARTUP)


def simulate(caps: dict, *, goal, scenarios: dict, data: dict, bar: float, values: dict, ms: dict, wins: dict,
             fr: str) -> tuple[dict, float, float, bool, float]:
    """One short pass replayed under the product's rule with `caps`: (plan per scenario, bench s optimistic,
    conservative, whether anything was stopped or not run, the decode's cold-start seconds)."""
    order = short_order(goal.scenarios, goal.objectives, caps)
    screen = Screen(fraction=data["fraction"], scenarios={}, judge=lambda r, s: None, bar=bar,
                    objectives=tuple(goal.objectives), baseline=values, caps=caps, order=order)
    measured, stopped, new_s, plan = {}, False, {}, {}
    dec_ttft, dec_tpot = ms.get(("decode" + fr, "ttft_ms_p50"), 0.0), ms.get(("decode" + fr, "tpot_ms_p50"), 0.0)
    cold = max(0.0, wins.get("decode" + fr, 0.0) - ms.get(("decode" + fr, "duration_s"), 0.0)
               - (dec_ttft + (scenarios["decode"].output_tokens - 1) * dec_tpot) / 1000)
    for name in order:
        rule, skip = screen.plan(name, measured, after_stop=stopped)
        dur = ms.get((name + fr, "duration_s"), 0.0)
        warm = wins.get(name + fr, 0.0) - dur
        if skip is not None:
            plan[name], new_s[name] = "not run", 0.0
            for label, v in skip.items():
                measured.setdefault(label, []).append(v)
            stopped = True
            continue
        run_s = dur
        if name == "throughput":
            possible = scenarios["throughput"].num_requests * scenarios["throughput"].output_tokens
            if ms.get((name + fr, "stopped_early")):  # its whole length as the screen estimated it
                run_s = dur * ms[(name + fr, "output_tokens_possible")] / max(ms.get((name + fr, "output_tokens_seen"), 0.0), 1.0)
            floor = throughput_floor(rule) if rule is not None else None
            cut_at = possible / floor if floor else math.inf
            value = possible / run_s
            if cut_at < run_s:
                plan[name], run_s, value, stopped = f"stopped at {cut_at:.2f} s (floor {floor:.1f} tok/s)", cut_at, possible / cut_at, True
            else:
                said = f", floor {floor:.1f} tok/s" if floor else ""
                plan[name] = f"whole ({run_s:.2f} s{said})"
            measured.setdefault(objective_label("throughput", "output_throughput"), []).append(value)
        elif name == "decode":
            sc = scenarios["decode"]
            n = ms.get((name + fr, "completed"), 2.0)
            at = decode_stop_s(rule, dec_ttft, dec_tpot, int(n), sc.output_tokens) if rule is not None else None
            if at is not None and at < dur:
                plan[name], run_s, stopped = f"stopped at {at:.2f} s (TPOT over {rule.speedups[0][1] / rule.below:.2f} ms)", at, True
            else:
                plan[name] = "whole" + (f" (limit {rule.speedups[0][1] / rule.below:.2f} ms)" if rule is not None else "")
            for o in goal.objectives:
                if o.scenario == "decode":
                    measured.setdefault(objective_label("decode", o.key), []).append(ms[(name + fr, o.key)])
        new_s[name] = warm + run_s
    rest = data["short_bench_s"] - sum(wins.values())
    first_changed = order[0] != goal.scenarios[0]
    optimistic = rest + sum(new_s.values())
    conservative = optimistic + (cold if first_changed and plan.get("decode") == "not run" else 0.0)
    cut = any(v.startswith("stopped") or v == "not run" for v in plan.values())
    return plan, optimistic, conservative, cut, cold


def replay_run(path: Path, default_scenarios: dict) -> list[dict]:
    import shutil

    with tempfile.TemporaryDirectory() as d:  # opened from a copy: a store may migrate the file it opens
        copy = Path(d) / path.name
        shutil.copy(path, copy)
        return _replay_run(copy, default_scenarios)


def _replay_run(path: Path, default_scenarios: dict) -> list[dict]:
    store = Store(f"sqlite:///{path}")
    run = store.list_runs()[-1]
    named = Path(str((run.config or {}).get("bench", {}).get("scenarios") or "")).name
    scenarios = load_scenarios_file(ROOT / "benchmarks" / "gpu" / named) if named and (ROOT / "benchmarks" / "gpu" / named).is_file() \
        else default_scenarios
    goal = GoalSpec.model_validate(run.goal)
    sol = store.events(run.id, kind="speed_of_light")
    import sqlite3

    with sqlite3.connect(path) as db:  # the floors were the run's model's: its speed-of-light gate ran
        checked = db.execute("select count(*) from gate_results where gate = 'speed_of_light'").fetchone()[0] > 0
    trials = store.list_trials(run.id)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text('{"shape": "the record\'s own"}')
        real = plausible.model_numbers
        if checked:
            plausible.model_numbers = lambda cfg: sol[-1].data["model"]  # the run's model shape, as recorded
        try:
            for e in store.events(run.id, kind="screen"):
                data = e.data or {}
                if data.get("skipped"):
                    continue
                t = next(x for x in trials if x.id == e.trial_id)
                bar = data.get("bar") or bar_of(e.message, t, trials, data["margin"])
                if bar is None:
                    continue
                # The newest good baseline before it: #0 or a sentinel (what the screen judged against).
                bases = [x for x in trials if x.number < t.number and (x.number == 0 or x.proposer == "sentinel") and x.status == "kept"]
                b = bases[-1]
                bm = {(m.scenario, m.metric): m.value for m in store.measurements(b.id)}
                values = {objective_label(o.scenario, o.key): bm[(o.scenario, o.key)] for o in goal.objectives}
                share = data.get("short_requests", 0) / data["full_requests"] if data.get("full_requests") else \
                    sum(short_scenario(scenarios[n], data["fraction"]).measured_requests for n in goal.scenarios) \
                    / sum(scenarios[n].num_requests for n in goal.scenarios)
                noise = data["margin"] * math.sqrt(share) / 2.0  # fidelity.margin's Z = 2 (exact where over MIN_MARGIN)
                base = verdict.Baseline(samples={k: [v] for k, v in values.items()}, values=values, noise=noise)
                caps = verdict.speedup_caps(store, run.id, base, Path(d), scenarios, goal.objectives) if checked else {}
                ms = {(m.scenario, m.metric): m.value for m in store.measurements(t.id)}
                wins = {ev.data["scenario"]: ev.data["window"]["wall_s"] for ev in store.events(run.id, kind="measure.host", trial_id=t.id)}
                fr = f"@{data['fraction']:g}"
                wins = {k: v for k, v in wins.items() if k.endswith(fr)}

                kw = {"goal": goal, "scenarios": scenarios, "data": data, "bar": bar, "values": values, "ms": ms, "wins": wins, "fr": fr}
                today = simulate({}, **kw)  # the product before this change: no caps, the goal's order, the throughput stop only
                plan, optimistic, conservative, cut, cold = simulate(caps, **kw)
                order = short_order(goal.scenarios, goal.objectives, caps)
                screened = is_screened(t)
                rows.append({"db": path.name, "trial": t.number, "knobs": t.knobs, "screened_in_run": screened,
                             "short_score": data["score"], "bar": bar, "bar_stored": data.get("bar") is not None,
                             "replay_stops": cut, "order": list(order), "plan": plan, "bench_s": round(data["short_bench_s"], 2),
                             "today": {"plan": today[0], "bench_s": round(today[2], 2), "stops": today[3]},
                             "new_bench_s": [round(optimistic, 2), round(conservative, 2)], "cold_s": round(cold, 2),
                             "caps": {k: round(v[0], 2) for k, v in caps.items()}, "ok": not cut or data["score"] < bar})
        finally:
            plausible.model_numbers = real
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dbs", nargs="*")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    scenarios = load_scenarios_file(ROOT / "benchmarks" / "gpu" / "scenarios.toml")
    dbs = [Path(p) for p in a.dbs] or sorted((ROOT / "benchmarks" / "gpu" / "results").glob("h200_*.db"))
    rows = [r for p in dbs for r in replay_run(p, scenarios)]
    for r in rows:
        print(f"{r['db'][5:-3]:34s} #{r['trial']:<2d} {'screened' if r['screened_in_run'] else 'passed  '} short pass "
              f"{r['bench_s']:5.2f} s run, {r['today']['bench_s']:5.2f} s today -> {r['new_bench_s'][0]:5.2f}-{r['new_bench_s'][1]:5.2f} s "
              f"{' | '.join(f'{k}: {v}' for k, v in r['plan'].items())}  (bar {r['bar']:.3f}{'' if r['bar_stored'] else ' rebuilt'})"
              f"{'' if r['ok'] else '  <-- STOPPED OVER ITS BAR'}")
    bad = [r for r in rows if not r["ok"]]
    today = sum(r["today"]["bench_s"] for r in rows)
    new = [sum(r["new_bench_s"][i] for r in rows) for i in (0, 1)]
    print(f"{len(rows)} short passes; stopped or cut short by the replayed rule: {sum(r['replay_stops'] for r in rows)} "
          f"(today's rule: {sum(r['today']['stops'] for r in rows)}), each with its short score under its bar: {not bad}; "
          f"the trials the rule stops that passed their screen in the run: "
          f"{[(r['db'][5:-3], r['trial']) for r in rows if r['replay_stops'] and not r['screened_in_run']] or 'none'}")
    print(f"short-pass bench: {today:.1f} s with today's rule -> {new[1]:.1f} s (conservative) / {new[0]:.1f} s (optimistic): "
          f"{today - new[1]:.1f}-{today - new[0]:.1f} s saved")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
