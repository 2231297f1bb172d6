"""The SLO rate search against a finer manual sweep: does the bench find the rate the sweep finds?

1. The bench's search (`orchestrator.bench.rate.find_rate`: doubling, then geometric bisection to
   `--precision`, then a longer confirmation step at the answer) for the highest Poisson request
   rate meeting the limits.
2. A manual sweep around it: every `--sweep-step` (2%) from `--sweep-from` to `--sweep-to` times
   the found rate, each step measured and judged exactly as the search judges one (same length,
   same percentile, same growth and client checks). The sweep's rate is the highest rate below the
   first failing one. Held to the search's standard of evidence: the search's decisive observation
   (its best pass) counts only once a longer step confirms it, so the sweep's decisive observation
   (a failure, which ends it) counts only once a re-check of the same length confirms it; a re-check
   that passes counts the rate as passed and the sweep goes on (`--no-recheck`: stop at the first
   failure, as before).

The claim: the two agree within 10%. By default it runs against the load-growing fake
server (tests/bench/loadserver.py: `--slots` requests at a time, capacity slots / service time);
``--url``/``--model`` point it at any OpenAI-compatible server instead.

Usage: ``PYTHONPATH=.:tests/bench python benchmarks/slo_rate.py [--slots 16 --ttft-ms 40 --tpot-ms 100] [--limit-ms 400]
[--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from orchestrator.bench import Scenario, run_scenario_sync  # noqa: E402
from orchestrator.bench.rate import RatePolicy, at_rate, confirm_policy, find_rate  # noqa: E402


def sweep(run, base: Scenario, limits, policy: RatePolicy, lo: float, hi: float, step: float,
          recheck: bool = True) -> tuple[float, list]:
    """Rates lo, lo*(1+step), ... up to hi; the highest passing rate before the first (re-checked) failure."""
    rows, best, rate = [], 0.0, lo
    while rate <= hi:
        st = at_rate(run, base, rate, limits, policy)
        rows.append(st.to_dict() | {"recheck": False})
        print(f"  sweep {rate:8.2f} req/s {'pass' if st.passed else 'FAIL'}  {st.why}", flush=True)
        if not st.passed and recheck:  # a failure ends the sweep only once a longer step confirms it
            st = at_rate(run, base, rate, limits, confirm_policy(policy))
            rows.append(st.to_dict() | {"recheck": True})
            print(f"  recheck {rate:6.2f} req/s {'pass' if st.passed else 'FAIL'}  {st.why}", flush=True)
        if not st.passed:
            break
        best, rate = rate, rate * (1 + step)
    return best, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start the load-growing fake server)")
    ap.add_argument("--model", default="fake")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--tpot-ms", type=float, default=100.0)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=4)
    ap.add_argument("--limit-ms", type=float, default=400.0, help="p90 TTFT limit")
    ap.add_argument("--start-rate", type=float, default=16.0)
    ap.add_argument("--precision", type=float, default=0.05)
    ap.add_argument("--min-seconds", type=float, default=3.0)
    ap.add_argument("--min-requests", type=int, default=20)
    ap.add_argument("--sweep-from", type=float, default=0.8)
    ap.add_argument("--sweep-to", type=float, default=1.3)
    ap.add_argument("--sweep-step", type=float, default=0.02)
    ap.add_argument("--confirmations", type=int, default=RatePolicy.confirmations,
                    help="the search's confirmation steps (0: trust its single best pass)")
    ap.add_argument("--no-recheck", dest="recheck", action="store_false",
                    help="the sweep stops at its first failure without re-checking it")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    base = Scenario(name="slo", prompt_tokens=a.prompt_tokens, output_tokens=a.output_tokens, warmup_requests=1, seed=9)
    limits = [("ttft_ms_p90", a.limit_ms)]
    policy = RatePolicy(start_rate=a.start_rate, precision=a.precision, min_seconds=a.min_seconds,
                        min_requests=a.min_requests, confirmations=a.confirmations)

    def measure(url: str) -> dict:
        def run(sc: Scenario):  # noqa: ANN202
            return run_scenario_sync(url, a.model, sc)

        t0 = time.monotonic()
        found = find_rate(run, base, limits, policy, on_step=lambda st: print(
            f"  search {st.rate:8.2f} req/s {'pass' if st.passed else 'FAIL'}  {st.why}", flush=True))
        t_search = time.monotonic() - t0
        confirm = {"search_confirmed": found.confirmed, "search_confirmations": found.confirmations,
                   "search_unconfirmed_rate": found.unconfirmed_rate}
        if found.rate == 0:  # nothing to sweep around
            return {"search_rate": 0.0, "search_steps": len(found.steps), "search_s": t_search, "sweep_rate": 0.0,
                    "sweep_steps": 0, "sweep_s": 0.0, "ratio": None, "error": found.error,
                    "steps": [s.to_dict() for s in found.steps]} | confirm
        t0 = time.monotonic()
        swept, rows = sweep(run, base, limits, policy, found.rate * a.sweep_from, found.rate * a.sweep_to, a.sweep_step,
                            a.recheck)
        return {"search_rate": found.rate, "search_steps": len(found.steps), "search_s": t_search,
                "client_bound": found.client_bound, "sweep_rate": swept, "sweep_steps": len(rows),
                "sweep_s": time.monotonic() - t0, "ratio": found.rate / swept if swept else None,
                "steps": [s.to_dict() for s in found.steps], "sweep": rows} | confirm

    load_before = os.getloadavg()
    if a.url:
        out = measure(a.url)
    else:
        import loadserver

        with loadserver.running(a.slots, a.ttft_ms, a.tpot_ms) as url:
            out = measure(url)
        out["capacity"] = loadserver.capacity(a.slots, a.ttft_ms, a.tpot_ms, a.output_tokens)
    out["args"] = vars(a)
    out["loadavg_before"], out["loadavg_after"] = load_before, os.getloadavg()
    ok = out["ratio"] is not None and abs(out["ratio"] - 1) <= 0.10
    print(f"search: {out['search_rate']:.2f} req/s in {out['search_steps']} steps ({out['search_s']:.0f} s; "
          f"{out['search_confirmations']} confirmation step(s), before them {out['search_unconfirmed_rate']:.2f}); "
          f"sweep: {out['sweep_rate']:.2f} req/s in {out['sweep_steps']} steps ({out['sweep_s']:.0f} s); "
          f"ratio {out['ratio'] or float('nan'):.3f} -> {'within' if ok else 'NOT within'} 10%")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
