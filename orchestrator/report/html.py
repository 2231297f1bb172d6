"""The HTML report: one self-contained page (inline CSS and SVG, no script, nothing fetched).

Sections: goal and verdict (with the paired interval when the controller recorded one),
best-so-far against time and against trials, the Pareto front (TTFT against throughput), gate
outcomes per trial, % of speed of light where measured, knob importance (Optuna's), the
knowledge-base entries the run wrote, cost, the human actions, and every trial with its "why".
A Content-Security-Policy of `default-src 'none'` makes any accidental fetch a visible error.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jinja2
import yaml

from orchestrator.core.oneline import plain_number
from orchestrator.report.render import build_report_data
from orchestrator.report.svg import best_so_far_svg, pareto_front, pareto_svg, timeline_svg, trial_timeline
from orchestrator.review.actions import human_actions
from orchestrator.review.pareto import Front, run_front
from orchestrator.review.trials import is_measurement
from orchestrator.review.why import explain_run, explain_trial

__all__ = ["build_html_data", "write_html_report"]

GATE_ORDER = ("integrity", "accuracy", "audit", "performance")  # the order a trial meets them
_INTERVAL_KEYS = ("interval", "ci", "paired_interval")


def _goal_pareto(front: Front) -> dict[str, Any] | None:
    """A two-objective goal's front: its minimized objective across, its maximized one up."""
    if not front.points:
        return None
    pairs = list(zip(front.labels, front.objectives, strict=True))
    (x, ox), (y, oy) = sorted(pairs, key=lambda p: p[1].info.direction == "maximize")
    svg = pareto_svg(front.points, front.members, x=x, y=y, xlabel=f"{ox.describe()} ({ox.info.unit}, {x})",
                     ylabel=f"{oy.describe()} ({oy.info.unit}, {y})")
    return {"goal": True, "x": x, "y": y, "x_unit": ox.info.unit, "y_unit": oy.info.unit, "points": front.points,
            "front": front.members, "svg": svg}


def _pareto(store: Any, trials: list[Any]) -> dict[str, Any] | None:
    """The goal's own front when it trades off two objectives (`review.pareto.run_front`); otherwise
    TTFT p50 against output throughput per trial, on the scenario most trials measured both on."""
    front = run_front(store, trials[0].run_id) if trials else None
    if front is not None:
        return _goal_pareto(front)
    per: dict[str, dict[int, dict[str, list[float]]]] = {}
    for t in trials:
        for m in store.measurements(t.id):
            if m.metric in ("ttft_ms_p50", "output_throughput"):
                per.setdefault(m.scenario, {}).setdefault(t.number, {}).setdefault(m.metric, []).append(m.value)
    usable = {s: {n: v for n, v in d.items() if len(v) == 2} for s, d in per.items()}
    usable = {s: d for s, d in usable.items() if d}
    if not usable:
        return None
    # Throughput is what the throughput scenario is for; otherwise the best-covered one.
    scenario = "throughput" if "throughput" in usable else max(usable, key=lambda s: len(usable[s]))
    status = {t.number: t.status for t in trials if not is_measurement(t)}  # measurements are not trials
    points = [{"number": n, "status": status[n], "ttft": sum(v["ttft_ms_p50"]) / len(v["ttft_ms_p50"]),
               "throughput": sum(v["output_throughput"]) / len(v["output_throughput"])}
              for n, v in sorted(usable[scenario].items()) if n in status and status[n] not in ("failed", "invalid")]
    if not points:
        return None
    front = pareto_front(points)
    return {"scenario": scenario, "points": points, "front": front, "svg": pareto_svg(points, front, scenario)}


# Floors from `benchmarks/gpu/sol.py` (`infergoal floors FILE`): floor key -> (scenario, metric, higher is better).
SOL_FLOORS = {
    "prefill_ttft_ms": ("prefill", "ttft_ms_p50", False),
    "decode_tpot_ms": ("decode", "tpot_ms_p50", False),
    "throughput_tok_s": ("throughput", "output_throughput", True),
}


def _speed_of_light(store: Any, run_id: int, trials: list[Any]) -> list[dict[str, Any]]:
    """% of the physical limit for the baseline and the best trial, where the run has floors.

    Floors come from a `speed_of_light` event (`{"floors": {...}}` as `benchmarks/gpu/sol.py`
    writes them); a measurement named `*_sol_pct` is taken as already computed.
    """
    rows = []
    for t in trials:
        for m in store.measurements(t.id):
            if m.metric.endswith("_sol_pct"):
                rows.append({"trial": t.number, "label": f"{m.scenario}:{m.metric}", "pct": m.value})
    events = store.events(run_id, kind="speed_of_light")
    floors = (events[-1].data or {}).get("floors", {}) if events and isinstance(events[-1].data, dict) else {}
    run = store.get_run(run_id)
    shown = [t for t in trials if t.number == 0 or t.id == run.best_trial_id]
    for t in shown:
        means: dict[tuple[str, str], list[float]] = {}
        for m in store.measurements(t.id):
            means.setdefault((m.scenario, m.metric), []).append(m.value)
        for key, (scenario, metric, higher) in SOL_FLOORS.items():
            values, floor = means.get((scenario, metric)), floors.get(key)
            if values and isinstance(floor, (int, float)) and floor > 0:
                v = sum(values) / len(values)
                pct = 100 * (v / floor if higher else floor / v)
                rows.append({"trial": t.number, "label": f"{scenario}:{metric} vs floor {plain_number(float(floor))}", "pct": pct})
    return rows


def _importance(store: Any, run_id: int) -> tuple[dict[str, float], str]:
    """Optuna's parameter importances over the run's scored trials (empty, with why, when it cannot say)."""
    import optuna

    from orchestrator.knowledge.distill import enough_for_importance
    from orchestrator.review.study import build_study

    try:
        study = build_study(store, run_id)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        varied = [k for k in sorted({k for t in done for k in t.params}) if len({repr(t.params.get(k)) for t in done}) > 1]
        if not enough_for_importance(len(done), len(varied)):
            return {}, (f"{len(done)} scored trial{'s' if len(done) != 1 else ''} for {len(varied)} knob"
                        f"{'s' if len(varied) != 1 else ''} varied: a ranking needs more trials than knobs")
        return dict(optuna.importance.get_param_importances(study)), ""
    except (ValueError, RuntimeError, LookupError) as e:  # one value per knob, or no variation: nothing to rank
        return {}, str(e)


def _kb_entries(store: Any, run_id: int) -> list[dict[str, Any]]:
    """The knowledge-base entries the run wrote (`kb.write_back` events), read back when still on disk."""
    from orchestrator.knowledge.kb import parse_entry

    out = []
    for e in store.events(run_id, kind="kb.write_back"):
        path = Path((e.data or {}).get("path", "")) if isinstance(e.data, dict) else Path()
        entry = {"path": str(path), "message": e.message, "ts": e.ts, "title": "", "status": "", "body": ""}
        if path.is_file():
            try:
                parsed = parse_entry(path)
                entry.update(title=str(parsed.meta.get("title", "")), status=parsed.status, body=parsed.body.strip()[:600])
            except (ValueError, KeyError, OSError, yaml.YAMLError):
                entry["body"] = "(entry no longer readable)"
        out.append(entry)
    return out


def _interval(store: Any, best: Any) -> dict[str, Any] | None:
    """The paired interval behind the verdict, if the controller recorded one for the best trial.

    Read from a `paired` event (`score`, `lo`, `hi`, `confidence`, `rounds`), a decision record's
    `paired`/`interval`, or the performance gate's details: the newest that has one.
    """
    if best is None:
        return None
    sources = [g.details for g in store.gate_results(best.id) if g.gate == "performance" and isinstance(g.details, dict)]
    sources += [e.data for e in store.events(best.run_id) if e.trial_id == best.id and isinstance(e.data, dict)]
    rec = getattr(best, "decision", None)
    if isinstance(rec, dict):
        sources.append(rec)
    sources += [src["paired"] for src in list(sources) if isinstance(src.get("paired"), dict)]
    for src in reversed(sources):
        if "lo" in src and "hi" in src and src.get("score"):
            return {"low": float(src["lo"]), "high": float(src["hi"]), "score": float(src["score"]),
                    "confidence": src.get("confidence"), "rounds": src.get("rounds"), "source": "paired"}
        for k in _INTERVAL_KEYS:
            v = src.get(k)
            if isinstance(v, (list, tuple)) and len(v) == 2:
                return {"low": float(v[0]), "high": float(v[1]), "source": k}
            if isinstance(v, dict) and {"low", "high"} <= set(v):
                return {"low": float(v["low"]), "high": float(v["high"]), "source": k}
        if "ci_low" in src and "ci_high" in src:
            return {"low": float(src["ci_low"]), "high": float(src["ci_high"]), "source": "ci"}
    return None


def build_html_data(store: Any, run_id: int) -> dict[str, Any]:
    """Everything the HTML template shows, as plain data (also what `report --json` could print)."""
    base = build_report_data(store, run_id)
    run = store.get_run(run_id)
    trials = store.list_trials(run_id)
    t0 = run.created_at
    rows = []
    elapsed = 0.0
    for t, row in zip(trials, base.trials, strict=True):
        elapsed += (t.timings or {}).get("total", 0.0)
        clock = (t.finished_at - t0).total_seconds() if t.finished_at else elapsed
        why = explain_trial(store, run_id, t.number)
        gates = {g.gate: {"status": g.status, "reason": g.reason} for g in store.gate_results(t.id)}
        rows.append({**row, "minutes": max(clock, elapsed) / 60, "why": why.sentence, "decided_by": why.decided_by, "gates": gates})
    gate_names = [g for g in GATE_ORDER if any(g in r["gates"] for r in rows)]
    gate_names += sorted({g for r in rows for g in r["gates"]} - set(gate_names))
    timeline = trial_timeline(trials)
    importance, importance_note = _importance(store, run_id)
    best = store.get_trial(run.best_trial_id) if run.best_trial_id else None
    return {
        "d": base, "trials": rows, "gate_names": gate_names,
        "verdict": {"met": (run.stop_reason or "").startswith("GoalMet"), "stop_reason": run.stop_reason,
                    "interval": _interval(store, best)},
        "plots": {
            "best_vs_trials": best_so_far_svg(rows, x="number", xlabel="trial"),
            "best_vs_time": best_so_far_svg(rows, x="minutes", xlabel="minutes since the run started"),
            "timeline": timeline_svg(timeline),
        },
        "timeline": timeline,
        "pareto": _pareto(store, trials),
        "sol": _speed_of_light(store, run_id, trials),
        "importance": importance, "importance_note": importance_note,
        "kb": _kb_entries(store, run_id),
        "cost": explain_run(store, run_id),
        "actions": human_actions(store, run_id),
    }


def write_html_report(store: Any, run_id: int, out_dir: str | Path) -> Path:
    """Write `report.html` (self-contained) into `out_dir`; return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = lambda v, nd=2: "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"
    html = env.get_template("report.html.j2").render(**build_html_data(store, run_id))
    path = out / "report.html"
    path.write_text(html)
    return path
