"""SLO goals in the knowledge base: which knob moved the request rate a server sustains under the limits.

A run on an SLO goal ("maximize throughput with p90 TTFT under 300 ms") scores each trial by the
highest request rate meeting the limits (`bench.rate`), over the baseline's. What a later SLO run
wants from it is not only the winner's knobs but which knob changes moved that rate, by how much,
under which limits: `rate_moves` reads that from the store (each scored trial's rate at the SLO
and its knob changes against the baseline), `write_slo_finding` keeps it as one finding per
setting and SLO, and `slo_findings` (used by `reuse`) picks such findings for a later SLO goal,
closest limits first.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from orchestrator.config.goal import GoalSpec, SloGoal
from orchestrator.core.roles import LOOP_ADDED, RETIRED
from orchestrator.knowledge.entries import Entry, demote, parse_entry, promote
from orchestrator.knowledge.writeback import _has_run, _today, _write, digest
from orchestrator.trial.context import objective_label

__all__ = ["limits_fit", "rate_moves", "slo_findings", "slo_key", "write_slo_finding"]

_SCORED = ("kept", "discarded")
_UNITS = {"rate": "req/s", "goodput": "req/s"}


def slo_key(slo: SloGoal) -> dict[str, Any]:
    """How a finding names the SLO it was measured under (its `slo` field)."""
    return {"maximize": slo.maximize, "limits": [{"metric": lim.metric, "stat": lim.stat, "value": lim.value}
                                                 for lim in slo.limits], "describe": slo.describe()}


def rate_moves(store: Any, run_id: int) -> dict[str, Any] | None:
    """The rate at the SLO of the baseline and of each scored trial, with the knob changes that got
    there and their measured deltas; per changed knob value, the median delta over the trials that
    made it (one-knob trials apart: they alone pin the change on that knob). None when the run's
    goal does not maximize a rate under limits, or its baseline has no rate."""
    run = store.get_run(run_id)
    if run is None or not isinstance(run.goal, dict) or not run.goal.get("slo"):
        return None
    goal = GoalSpec.model_validate(run.goal)
    if goal.slo is None or goal.slo.maximize is None:
        return None
    label = objective_label(goal.objectives[0].scenario, goal.objectives[0].key)
    trials = [t for t in store.list_trials(run_id) if t.proposer not in RETIRED]
    base = next((t for t in trials if t.number == 0), None)
    r0 = (base.objective or {}).get(label) if base else None
    if not r0:
        return None
    moves = []
    for t in trials:
        rate = (t.objective or {}).get(label)
        if not t.number or t.proposer in LOOP_ADDED or t.status not in _SCORED or rate is None:
            continue
        changed = {k: [base.knobs.get(k), v] for k, v in t.knobs.items() if base.knobs.get(k) != v}
        if changed:
            moves.append({"trial": t.number, "status": t.status, "changed": changed, "rate": round(float(rate), 4),
                          "delta": round(float(rate) / r0 - 1.0, 4)})
    per: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for m in moves:
        for k, (_, v) in m["changed"].items():
            per.setdefault((k, repr(v)), []).append(m)
    knobs = []
    for (k, _), ms in per.items():
        alone = [m["delta"] for m in ms if len(m["changed"]) == 1]
        knobs.append({"knob": k, "value": ms[0]["changed"][k][1], "baseline_value": base.knobs.get(k),
                      "trials": [m["trial"] for m in ms], "median_delta": round(statistics.median(m["delta"] for m in ms), 4),
                      "alone_delta": round(statistics.median(alone), 4) if alone else None})
    # A knob measured alone is named on its own evidence; the rest by their trials' median.
    knobs.sort(key=lambda e: (e["alone_delta"] is None, -abs(e["alone_delta"] if e["alone_delta"] is not None
                                                             else e["median_delta"])))
    best = max(moves, key=lambda m: m["rate"], default=None)
    kept_best = best if best and best["rate"] > r0 else None
    return {"slo": slo_key(goal.slo), "metric": goal.slo.maximize, "unit": _UNITS[goal.slo.maximize],
            "baseline": {"trial": 0, "rate": round(float(r0), 4), "knobs": dict(base.knobs)},
            "best": kept_best and {**kept_best, "knobs": dict(next(t for t in trials if t.number == kept_best["trial"]).knobs)},
            "moves": moves, "knobs": knobs, "top_knob": knobs[0]["knob"] if knobs else None}


def write_slo_finding(write_dir: Path, store: Any, run_id: int, applies_to: dict[str, Any], key: list[Any]) -> Path | None:
    """One finding per setting and SLO: the rate at the SLO, which knob changes moved it and by how
    much, and the best knob set (so a later run can warm-start from it). A later run under the same
    SLO that finds the same top knob raises its status, one that finds another lowers it."""
    d = rate_moves(store, run_id)
    if d is None or not d["moves"]:
        return None
    engine = applies_to["engine"]
    fid = f"finding-{engine}-slo-{digest(*key, d['slo']['maximize'], d['slo']['limits'])}"
    path = write_dir / "findings" / f"{fid}.md"
    unit, r0 = d["unit"], d["baseline"]["rate"]
    what = "request rate" if d["metric"] == "rate" else "goodput"
    lines = [f"- `{e['knob']}` {e['baseline_value']!r} -> {e['value']!r}: "
             + (f"{e['alone_delta']:+.0%} alone, " if e["alone_delta"] is not None else "")
             + f"median {e['median_delta']:+.0%} over trials {e['trials']}" for e in d["knobs"]]
    best = d["best"]
    head = (f"\nRun {run_id}: the {what} sustained under {d['slo']['describe'].split(' with ', 1)[1]} was "
            f"{r0:g} {unit} at the baseline" + (f" and {best['rate']:g} {unit} at trial #{best['trial']} "
                                                f"({best['delta']:+.0%})" if best else "; no change beat it") + ".\n\n")
    body = (head + f"Knob changes and the {what} they measured against the baseline's (largest first; a change "
            "measured alone is pinned on that knob):\n" + "\n".join(lines) + "\n")
    evidence = {"run": run_id, "baseline_rate": r0, "best_rate": best["rate"] if best else None,
                "top_knob": d["top_knob"], "moves": d["moves"]}
    if path.is_file():
        old = parse_entry(path)
        meta = dict(old.meta)
        if not _has_run(meta, run_id):
            meta["status"] = promote(meta["status"]) if meta.get("top_knob") == d["top_knob"] else demote(meta["status"])
            meta["evidence"] = [*meta.get("evidence", []), evidence]
        meta.update(top_knob=d["top_knob"], rate_knobs=d["knobs"], slo_rate={"baseline": r0, "best": best and best["rate"],
                                                                               "unit": unit}, updated=_today())
        if best and best["rate"] >= float((meta.get("slo_rate") or {}).get("best") or 0.0):
            meta.update(knobs=best["knobs"], speedup=round(best["rate"] / r0, 4))
        return _write(path, meta, body)
    meta = {"id": fid, "kind": "finding", "applies_to": applies_to, "status": "hypothesis",
            "title": f"{engine} on {applies_to['hardware']}: `{d['top_knob']}` moved the {what} at "
                     f"{d['slo']['describe'].split(' with ', 1)[1]}",
            "slo": d["slo"], "slo_rate": {"baseline": r0, "best": best and best["rate"], "unit": unit},
            "top_knob": d["top_knob"], "rate_knobs": d["knobs"], "evidence": [evidence],
            "created": _today(), "updated": _today()}
    if best:
        meta.update(knobs=best["knobs"], speedup=round(best["rate"] / r0, 4))
    return _write(path, meta, body)


def limits_fit(found: dict[str, Any], slo: SloGoal) -> float:
    """How well a finding's SLO (`slo_key`) fits a goal's, in [0, 1]: 0 when they maximize different
    things or limit different metrics; else, per limit, the ratio of the smaller value to the larger
    (x0.8 on another percentile), multiplied. 300 ms against 250 ms fits 0.83."""
    if found.get("maximize") != slo.maximize:
        return 0.0
    theirs = {lim["metric"]: lim for lim in found.get("limits") or []}
    if set(theirs) != {lim.metric for lim in slo.limits}:
        return 0.0
    fit = 1.0
    for lim in slo.limits:
        t = theirs[lim.metric]
        fit *= min(lim.value, float(t["value"])) / max(lim.value, float(t["value"])) * (1.0 if t["stat"] == lim.stat else 0.8)
    return round(fit, 4)


def slo_findings(findings: list[tuple[float, Entry]], slo: SloGoal) -> list[tuple[float, Entry]]:
    """The findings measured under an SLO that fits `slo`, weight x fit, best first."""
    out = [(round(w * fit, 4), e) for w, e in findings if e.meta.get("slo") and (fit := limits_fit(e.meta["slo"], slo)) > 0]
    return sorted(out, key=lambda x: -x[0])
