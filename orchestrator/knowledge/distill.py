"""Distill a finished run into knowledge: the winner, each knob's effect, failures, dead ends.

Everything here is read from the store (the run's trials, gate results, errors, server logs), so
each item carries its evidence: run id, trial numbers and the measured numbers.
"""

from __future__ import annotations

import logging
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.roles import MEASUREMENTS, PROBE, RETIRED
from orchestrator.trial.fidelity import is_stopped

__all__ = ["Distilled", "classify_failure", "distill", "enough_for_importance", "importance_method"]

_SCORED = ("kept", "discarded")
_FAILED = ("failed", "invalid", "rejected")
_OOM = re.compile(r"out of memory|outofmemory|memoryerror|cannot allocate memory|oom|killed by signal 9|sigkill", re.I)
_STARTUP = re.compile(r"healthy|health check|ready|exited|did not start|startup|HostError|address already in use", re.I)


@dataclass
class Distilled:
    run_id: int
    goal: str
    baseline_knobs: dict[str, Any]
    winner: dict[str, Any] | None = None
    effects: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    dead_ends: list[dict[str, Any]] = field(default_factory=list)
    warm_trials: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    """Every search trial's knob set and score (failed ones 0.0): what a later run's search starts from."""
    probes: list[dict[str, Any]] = field(default_factory=list)
    """The winner's one-knob neighbours measured after the stop (`probe` trials): which knob moved the
    winner, and by how much. Kept apart from `observations`: they rank swaps, never the search's model."""


def _log_tail(path: str | None, limit: int = 4000) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def classify_failure(status: str, error: str | None, gates: list[Any], log_tail: str = "", launched: bool = True) -> tuple[str, str]:
    """(kind, reason): kind is `oom`, `startup`, `gate` or `error`."""
    text = f"{error or ''}\n{log_tail}"
    if _OOM.search(text):
        return "oom", (error or "out of memory in the server log").strip()[:300]
    failed_gates = [g for g in gates if g.status == "fail"]
    if status in ("invalid", "rejected") or failed_gates:
        g = failed_gates[0] if failed_gates else None
        return "gate", (f"{g.gate}: {g.reason}" if g else (error or status)).strip()[:300]
    if not launched or _STARTUP.search(error or ""):
        return "startup", (error or "the server did not start").strip()[:300]
    return "error", (error or status).strip()[:300]


def _eta2(rows: list[Any], names: list[str], value_of: Any) -> dict[str, float]:
    """One-way ANOVA share per knob: between-value variance / total variance of the metric.

    Used when Optuna's fANOVA cannot run (it needs scikit-learn); on a run's handful of trials
    it is also the easier number to read."""
    ys = [float(value_of(t)) for t in rows]
    mean = statistics.fmean(ys)
    total = sum((y - mean) ** 2 for y in ys)
    if total <= 0:
        return {}
    out = {}
    for n in names:
        groups: dict[str, list[float]] = defaultdict(list)
        for t, y in zip(rows, ys, strict=False):
            groups[repr(t.knobs.get(n))].append(y)
        between = sum(len(g) * (statistics.fmean(g) - mean) ** 2 for g in groups.values())
        out[n] = round(between / total, 4)
    return out


def enough_for_importance(trials: int, varied: int) -> bool:
    """Whether `trials` scored knob sets (the baseline among them) can rank `varied` knobs: more of
    them than knobs (n knobs have n + 1 unknowns even in a linear model). One trial that changed 7
    knobs against the baseline tells nothing about which of the 7 mattered (each gets the same
    share), so no importance and no top knob is drawn from it; one that changed one knob does."""
    return trials >= 2 and trials > varied


def importance_method() -> str:
    """Which importance the effects carry: Optuna's fANOVA needs scikit-learn, else eta squared."""
    try:
        import sklearn  # noqa: F401 - optional
    except ImportError:
        return "eta squared (one-way ANOVA)"
    return "fANOVA (Optuna)"


def _importance(trials: list[Any], metric: str | None) -> dict[str, float]:
    """Importance of each knob for the score (metric None) or one objective metric.

    Optuna's fANOVA over the run's scored trials when scikit-learn is installed, else eta squared."""
    rows = [t for t in trials if (t.score if metric is None else (t.objective or {}).get(metric)) is not None]
    # Every knob any row has: a conditional knob (`when`) is absent where inactive, and absent
    # (None) is one more of its values, so it is judged over every row, not only where it exists.
    names = [n for n in sorted({k for t in rows for k in t.knobs}) if len({repr(t.knobs.get(n)) for t in rows}) > 1]
    if not names or not enough_for_importance(len(rows), len(names)):
        return {}

    def value_of(t: Any) -> float:
        return t.score if metric is None else t.objective[metric]

    try:
        import sklearn  # noqa: F401 - fANOVA's forest; optional
    except ImportError:
        return _eta2(rows, names, value_of)
    import optuna  # here, not at the top: the CLI imports this package and should start fast
    dists: dict[str, optuna.distributions.BaseDistribution] = {
        n: optuna.distributions.CategoricalDistribution(sorted({t.knobs.get(n) for t in rows}, key=repr)) for n in names}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for t in rows:
        study.add_trial(optuna.trial.create_trial(params={n: t.knobs.get(n) for n in names}, distributions=dists, value=float(value_of(t))))
    try:
        imp = optuna.importance.get_param_importances(study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    except (RuntimeError, ValueError, ZeroDivisionError) as e:  # too few distinct points for the forest
        logging.getLogger(__name__).debug("fANOVA skipped (%s); eta squared instead", e)
        return _eta2(rows, names, value_of)
    return {k: round(float(v), 4) for k, v in imp.items()}


def _value_effects(trials: list[Any], knob: str, base_value: Any, metrics: list[str], base_obj: dict[str, float]) -> dict[str, Any]:
    """Per value of one knob: trials, median score, and each metric's median change vs the baseline."""
    by_value: dict[str, list[Any]] = defaultdict(list)
    for t in trials:
        by_value[repr(t.knobs.get(knob))].append(t)
    out: dict[str, Any] = {}
    for value, ts in sorted(by_value.items()):
        row: dict[str, Any] = {"trials": sorted(t.number for t in ts),
                               "median_score": round(statistics.median(t.score for t in ts), 4)}
        for m in metrics:
            vals = [(t.objective or {}).get(m) for t in ts]
            vals = [v for v in vals if v is not None]
            if vals and base_obj.get(m):
                row[f"{m} change"] = round(statistics.median(vals) / base_obj[m] - 1.0, 4)
        out[value] = row
    return {"baseline_value": repr(base_value), "values": out}


def distill(store: Any, run_id: int) -> Distilled:
    run = store.get_run(run_id)
    every = [t for t in store.list_trials(run_id) if t.proposer not in RETIRED]
    trials = [t for t in every if t.proposer != PROBE]  # the search's own; probes are reported apart
    base = next((t for t in trials if t.number == 0), None)
    d = Distilled(run_id=run_id, goal=run.goal_text if run else "", baseline_knobs=dict(base.knobs) if base else {})
    if run is None or base is None:
        return d
    if run.best_trial_id is not None:
        best = store.get_trial(run.best_trial_id)
        if best is not None and best.number != 0 and best.score:
            d.winner = {"trial": best.number, "trial_id": best.id, "knobs": dict(best.knobs), "score": round(best.score, 4),
                        "objective": {k: round(v, 4) for k, v in (best.objective or {}).items()},
                        "confirmed_by_relaunch": "GoalMet" in (run.stop_reason or "")}
    # A short pass stopped early scored "at most" its bound: not a measurement to learn effects from.
    # Sentinels re-measure the baseline's knob set: measurements, not more trials of it.
    scored = [t for t in trials if t.status in _SCORED and t.score is not None and set(t.knobs) == set(base.knobs)
              and not is_stopped(t) and t.proposer not in MEASUREMENTS]
    metrics = sorted({m for t in scored for m in (t.objective or {})})
    base_obj = dict(base.objective or {})
    importance = {m: _importance(scored, m) for m in [None, *metrics]}
    for knob in sorted(base.knobs):
        if len({repr(t.knobs.get(knob)) for t in scored}) < 2:
            continue  # never varied: nothing measured about it
        eff = _value_effects(scored, knob, base.knobs[knob], metrics, base_obj)
        eff["knob"] = knob
        eff["importance"] = {("score" if m is None else m): imp[knob] for m, imp in importance.items() if knob in imp}
        d.effects.append(eff)
    d.effects.sort(key=lambda e: -e["importance"].get("score", 0.0))
    for t in every:
        if t.proposer == PROBE and d.winner and t.status in (*_SCORED, *_FAILED):
            changed = {k: v for k, v in t.knobs.items() if d.winner["knobs"].get(k) != v}
            if len(changed) == 1:
                (k, v), = changed.items()
                d.probes.append({"trial": t.number, "knob": k, "value": v, "knobs": dict(t.knobs),
                                 "score": 0.0 if t.status in _FAILED or t.score is None else round(t.score, 4)})
        # Paired halves and sentinels re-measure knob sets the search already measured: one made
        # `invalid` by a measurement decision (a round redone or abandoned, an untrusted measurement)
        # says nothing about its knobs, and is neither a failure nor an observation of them (the H200
        # 2B run's constraint listed its redone paired rounds as gate failures of the defaults, and its
        # observations scored the defaults 0.0). A measurement that *failed* (the server broke on a
        # relaunch) still counts as a failure.
        measurement = t.proposer in MEASUREMENTS
        if t.status in _FAILED and not (measurement and t.status != "failed"):
            kind, reason = classify_failure(t.status, t.error, store.gate_results(t.id), _log_tail(t.log_path), bool(t.launch_cmd))
            changed = {k: v for k, v in t.knobs.items() if base.knobs.get(k) != v}
            d.failures.append({"trial": t.number, "status": t.status, "kind": kind, "reason": reason, "changed": changed})
        if t.proposer == PROBE or measurement or is_stopped(t):  # a stopped short pass's score is a bound only
            continue
        if t.number and set(t.knobs) == set(base.knobs) and (t.status in _FAILED or (t.status in _SCORED and t.score is not None)):
            d.observations.append({"knobs": dict(t.knobs), "score": 0.0 if t.status in _FAILED else round(t.score, 4)})
        if (t.rationale or "").startswith("warm start"):
            d.warm_trials.append({"trial": t.number, "knobs": dict(t.knobs), "status": t.status,
                                  "score": None if t.score is None else round(t.score, 4)})
    # A direction (knob = value other than the baseline's) that every scored trial tried without
    # beating the baseline, at least twice: a dead end worth avoiding next time.
    for knob in sorted(base.knobs):
        groups: dict[str, list[Any]] = defaultdict(list)
        for t in scored:
            if t.number != 0 and t.knobs.get(knob) != base.knobs[knob]:
                groups[repr(t.knobs[knob])].append(t)
        for _value, ts in groups.items():
            if len(ts) >= 2 and all(t.score <= 1.0 for t in ts):
                d.dead_ends.append({"knob": knob, "value": ts[0].knobs[knob], "trials": sorted(t.number for t in ts),
                                    "best_score": round(max(t.score for t in ts), 4)})
    return d
