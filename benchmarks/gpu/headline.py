"""Headline figures from one ib_baseline.py run: speedups over IB's naive server and % of the floor.

    python3 benchmarks/gpu/headline.py RESULTS.json [--server fast] [--sol benchmarks/gpu/results/sol.json]
        [--scenarios benchmarks/gpu/scenarios_ib.toml] [--out benchmarks/gpu/results/headline.json]

Speedups per scenario, as InferenceBench scores them (hpo_search_baselines.primary_metric):
A (prefill) TTFT p50, B (decode) TPOT p50, C (throughput) request throughput, D (general) the cube
root of the three ratios (TTFT p50, TPOT p50, request throughput); their geometric mean is
``geomean_vs_ib_naive``. The floors come from sol.json's measured ceilings and model numbers,
re-floored for the scenarios' own shapes (sol.floors): A and B as floor/ours, C as ours/floor;
D has no floor (sol.py defines none). headline.json is updated, not replaced: only the fields
below change, each naming the files it came from.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import tomllib

HERE = Path(__file__).resolve().parent


def _m(report: dict[str, Any], server: str, scenario: str) -> dict[str, float] | None:
    s = (report.get("servers", {}).get(server, {}).get("scenarios", {}) or {}).get(scenario) or {}
    return s.get("metrics") if s.get("ok") else None


def _count(report: dict[str, Any], server: str, scenario: str) -> int | None:
    """How many requests ``server`` was measured with in ``scenario`` (None: not run)."""
    s = report.get("servers", {}).get(server, {}).get("scenarios", {}).get(scenario) or {}
    return s.get("num_requests") if "metrics" in s else None


def _ci(report: dict[str, Any], server: str, scenario: str) -> dict[str, Any] | None:
    """ib_baseline.py's 95% intervals for ``scenario`` on ``server`` (None where not recorded)."""
    s = report.get("servers", {}).get(server, {}).get("scenarios", {}).get(scenario) or {}
    return s.get("ci95")


def _ratio(naive: float | None, ours: float | None) -> float | None:
    if not naive or not ours or naive <= 0 or ours <= 0:
        return None
    return naive / ours


def speedups(naive: dict[str, dict | None], ours: dict[str, dict | None]) -> dict[str, float | None]:
    """Per-scenario speedups of ``ours`` over ``naive`` (metric dicts by scenario name; None: not measured)."""
    out: dict[str, float | None] = {}
    a, na = ours.get("prefill"), naive.get("prefill")
    out["prefill"] = _ratio(na and na.get("ttft_ms_p50"), a and a.get("ttft_ms_p50"))
    b, nb = ours.get("decode"), naive.get("decode")
    out["decode"] = _ratio(nb and nb.get("tpot_ms_p50"), b and b.get("tpot_ms_p50"))
    c, nc = ours.get("throughput"), naive.get("throughput")
    out["throughput"] = _ratio(c and c.get("request_throughput"), nc and nc.get("request_throughput"))
    d, nd = ours.get("general"), naive.get("general")
    parts = [_ratio(nd and nd.get("ttft_ms_p50"), d and d.get("ttft_ms_p50")),
             _ratio(nd and nd.get("tpot_ms_p50"), d and d.get("tpot_ms_p50")),
             _ratio(d and d.get("request_throughput"), nd and nd.get("request_throughput"))]
    out["general"] = math.prod(parts) ** (1 / 3) if all(p is not None for p in parts) else None
    return out


def geomean(values: list[float | None]) -> float | None:
    """Geometric mean, None if any value is missing."""
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def ib_floors(sol: dict[str, Any], scenarios: dict[str, Any]) -> dict[str, float]:
    """sol.py's floors for these scenarios' shapes, from sol.json's ceilings and model numbers."""
    from sol import floors  # noqa: PLC0415  (sol.py imports torch; only needed here)

    return floors(scenarios, sol["model"], sol["ceilings"])


def compute(report: dict[str, Any], sol: dict[str, Any], scenarios: dict[str, Any], *, server: str = "fast",
            naive: str = "ib_naive") -> dict[str, Any]:
    """The headline numbers (values only; :func:`write_headline` adds the sources)."""
    names = ("prefill", "decode", "throughput", "general")
    ours = {n: _m(report, server, n) for n in names}
    base = {n: _m(report, naive, n) for n in names}
    sp = speedups(base, ours)
    fl = ib_floors(sol, scenarios)
    a, b, c = ours["prefill"], ours["decode"], ours["throughput"]
    frac = {
        "prefill": fl["prefill_ttft_ms"] / a["ttft_ms_mean"] if a and a.get("ttft_ms_mean") else None,
        "decode": fl["decode_tpot_ms"] / b["tpot_ms_mean"] if b and b.get("tpot_ms_mean") else None,
        "throughput": c["output_throughput"] / fl["throughput_tok_s"] if c and c.get("output_throughput") else None,
    }
    return {
        "tpot_b_ms": {"value": b["tpot_ms_mean"] if b else None, "p50": b.get("tpot_ms_p50") if b else None,
                      "metric": "decode tpot_ms_mean"},
        "ttft_a_ms": {"value": a["ttft_ms_mean"] if a else None, "p50": a.get("ttft_ms_p50") if a else None,
                      "metric": "prefill ttft_ms_mean"},
        "c_frac_of_floor": {"value": frac["throughput"], "floor_tok_s": fl["throughput_tok_s"],
                            "metric": "throughput output_throughput / floor"},
        "geomean_vs_ib_naive": {"value": geomean([sp[n] for n in names]), "per_scenario": sp,
                                "metric": "IB's scores: A TTFT p50, B TPOT p50, C req/s, D cube root of the three",
                                "naive_requests": {n: _count(report, naive, n) for n in names},
                                "naive_ci95": {n: _ci(report, naive, n) for n in names}},
        "frac_of_floor": {"value": frac, "floors": fl},
    }


def write_headline(results: str | Path, sol: str | Path, scenarios: str | Path, out: str | Path, *,
                   server: str = "fast", naive: str = "ib_naive") -> dict[str, Any]:
    """Compute the headline figures from ``results`` and update ``out`` with them; returns them."""
    report = json.loads(Path(results).read_text())
    sol_d = json.loads(Path(sol).read_text())
    scen = tomllib.loads(Path(scenarios).read_text())
    h = compute(report, sol_d, scen, server=server, naive=naive)
    for key, val in h.items():
        val["source"] = str(results)
        val["server"] = server
        if key in ("c_frac_of_floor", "frac_of_floor"):
            val["floor_source"] = str(sol)
    out = Path(out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc.update(h)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return h


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="ib_baseline.py's JSON")
    ap.add_argument("--server", default="fast", help="the label of our server in it")
    ap.add_argument("--sol", default=str(HERE / "results" / "sol.json"))
    ap.add_argument("--scenarios", default=str(HERE / "scenarios_ib.toml"))
    ap.add_argument("--out", default=str(HERE / "results" / "headline.json"))
    args = ap.parse_args(argv)
    print(json.dumps(write_headline(args.results, args.sol, args.scenarios, args.out, server=args.server), indent=2))


if __name__ == "__main__":
    main()
