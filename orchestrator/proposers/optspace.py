"""The knob space as the search's Optuna study sees it, and what the study is told of a trial.

`distributions` maps the target's knobs to Optuna distributions (`restrict` narrows one to a prior's region),
`suggest` asks a trial for them define-by-run (conditional knobs only while active), `fits` says whether a knob
set lies inside them, and `neighbours` lists a knob set's one-knob moves (the walk's steps, the winner's
probes). `told` and `constraints` say what TPE is told of a stored trial: its score or the failure value, and
the failed-region and goal-bar constraints of Optuna's constraint-aware TPE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna

from orchestrator.proposers import multiobjective
from orchestrator.targets import TargetSpec
from orchestrator.targets.space import active_only, is_active
from orchestrator.trial.fidelity import is_stopped

__all__ = ["FAILED_VALUE", "GOAL_CONSTRAINT", "REGION_CONSTRAINT", "complete", "constraints", "distributions", "fits",
           "neighbours", "restrict", "suggest", "told"]

# What the sampler is told for trials that produced no valid speed: worse than any real result,
# so TPE steers away from knob sets that crash the server or break accuracy.
FAILED_VALUE = 0.0
# The Optuna constraint a knob set inside a failed region breaks (> 0: infeasible).
REGION_CONSTRAINT = "failed_region"
# The Optuna constraint a trial that misses one of the goal's bars breaks (`SearchProposer.goal`).
GOAL_CONSTRAINT = "goal_bars"


def distributions(target: TargetSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for name, k in target.knobs.items():
        if k.type == "bool":
            out[name] = optuna.distributions.CategoricalDistribution([False, True])
        elif k.type == "categorical":
            out[name] = optuna.distributions.CategoricalDistribution(list(k.choices))
        elif k.type == "int":
            out[name] = optuna.distributions.IntDistribution(int(k.low), int(k.high), log=k.log)
        else:
            out[name] = optuna.distributions.FloatDistribution(k.low, k.high, log=k.log)
    return out


def restrict(d: optuna.distributions.BaseDistribution, allowed: Any) -> optuna.distributions.BaseDistribution:
    """`d` limited to `allowed` (values, or [low, high]); unchanged where they do not meet (this
    run's space pins the knob elsewhere: the region says nothing about it)."""
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        kept = [c for c in d.choices if c in allowed]
        return optuna.distributions.CategoricalDistribution(kept) if kept else d
    lo, hi = max(d.low, allowed[0]), min(d.high, allowed[1])
    if lo > hi:
        return d
    if isinstance(d, optuna.distributions.IntDistribution):
        return optuna.distributions.IntDistribution(int(lo), int(hi), log=d.log)
    return optuna.distributions.FloatDistribution(lo, hi, log=d.log)


def fits(knobs: dict[str, Any], dists: dict[str, Any]) -> bool:
    for k, v in knobs.items():
        d = dists.get(k)
        if d is None:
            return False
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            if v not in d.choices:
                return False
        elif not d.low <= v <= d.high:
            return False
    return True


def suggest(trial: optuna.trial.Trial, target: TargetSpec, dists: dict[str, Any]) -> dict[str, Any]:
    """Ask for each knob in declaration order, skipping the ones inactive under those so far."""
    params: dict[str, Any] = {}
    for name, knob in target.knobs.items():
        if is_active(knob, params):
            d = dists[name]
            if isinstance(d, optuna.distributions.CategoricalDistribution):
                params[name] = trial.suggest_categorical(name, list(d.choices))
            elif isinstance(d, optuna.distributions.IntDistribution):
                params[name] = trial.suggest_int(name, d.low, d.high, log=d.log)
            else:
                params[name] = trial.suggest_float(name, d.low, d.high, log=d.log)
    return params


def neighbours(target: TargetSpec, knobs: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    """(knob, value, knob set): `knobs` with one knob changed. Every other value of a categorical or
    bool knob (choices are unordered: `threads` 0 means "all cores", not "fewer than 1"); the
    adjacent values of an int or float knob (x2 and /2 on a log scale, a tenth of the range
    otherwise, clamped). In the target's knob order; only knob sets its constraints allow."""
    out = []
    for name, knob in target.knobs.items():
        if name not in knobs or not is_active(knob, knobs):
            continue
        v = knobs[name]
        if knob.type == "bool":
            values: list[Any] = [not v]
        elif knob.type == "categorical":  # unordered: a declared choice list says nothing about distance
            values = [c for c in knob.choices if c != v]
        else:
            lo, hi = float(knob.low), float(knob.high)
            cand = [v / 2, v * 2] if knob.log else [v - (hi - lo) / 10, v + (hi - lo) / 10]
            if knob.type == "int":
                cand = [round(c) for c in cand]
            values = sorted({min(max(c, lo), hi) for c in cand} - {v})
            if knob.type == "int":
                values = [int(c) for c in values]
        for value in values:
            k = active_only(target, dict(knobs) | {name: value})
            try:
                target.validate_knobs(k)
            except ValueError:
                continue
            out.append((name, value, k))
    return out


def told(t: Any, objectives: Sequence[Any], failed: Any) -> dict[str, Any]:
    """What TPE is told of finished trial `t`: its score (MOTPE: its objective values; a failure: `failed`).
    A screened trial whose short pass was stopped early (`fidelity.is_stopped`) scored only "at most" its
    stored bound (~the bar), not a measurement: told as pruned at it, which Optuna's TPE ranks under every
    complete trial (its short score was under the bar; told as the bound it would rank beside the best)."""
    if objectives:
        return {"values": multiobjective.values_of(t, objectives, failed)}
    if is_stopped(t) and t.score:
        return {"state": optuna.trial.TrialState.PRUNED, "intermediate_values": {0: float(t.score)}}
    return {"value": t.score if t.status in ("kept", "discarded") and t.score else FAILED_VALUE}


def constraints(goal: dict[int, float], number: int | None, inside: bool = False) -> dict[str, float] | None:
    """The Optuna constraints of trial `number` (None: a draw told as failed): REGION_CONSTRAINT inside a failed
    region; GOAL_CONSTRAINT while the loop steers by the goal's bars (`SearchProposer.goal`), a trial it does
    not name missing them by more than any it names. None when neither applies."""
    out = {REGION_CONSTRAINT: 1.0} if inside else {}
    if goal:
        out[GOAL_CONSTRAINT] = goal[number] if number in goal else 1.0 + max(max(goal.values()), 0.0)
    return out or None


def complete(study: optuna.Study) -> int:
    """Trials TPE counts for its start-up (complete and pruned, as `TPESampler` counts them)."""
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state in done)
