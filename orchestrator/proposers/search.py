"""SearchProposer: Optuna TPE over the target's knob space (ask/tell, seeded, no API key).

The study is rebuilt from the stored history on every call instead of being kept in memory:
that makes the proposer stateless, so `infergoal resume` after a kill -9 needs nothing but
the database, and the store stays the single source of truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna

from orchestrator.proposers.base import Candidate, knob_key
from orchestrator.targets import TargetSpec
from orchestrator.targets.failures import refused_values
from orchestrator.targets.space import active_only, is_active
from orchestrator.targets.spec import ConstraintViolated

__all__ = ["SearchProposer", "distributions"]

# What the sampler is told for trials that produced no valid speed: worse than any real result,
# so TPE steers away from knob sets that crash the server or break accuracy.
FAILED_VALUE = 0.0
_FINISHED = {"kept", "discarded", "failed", "invalid", "needs_approval", "rejected"}


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


# A transferred prior steers the search until the run has this many scored trials of its own
# (times the prior's weight), or until its winner loses here; then the run's own evidence rules.
PRIOR_HORIZON = 12


class SearchProposer:
    """TPE with `n_startup` random trials; prior good knob sets (the KB) are tried first.

    `priors` ({knobs, score, weight}, from `KnowledgeBase.prior_observations`): what a similar
    setting measured. They enter the TPE model as extra finished trials while they still fit
    (`_prior_trials`), so the first proposals already avoid what failed there and aim at what won."""

    name = "search"

    def __init__(self, seed: int = 0, n_startup: int = 4, warm_start: Sequence[dict[str, Any]] = (),
                 priors: Sequence[dict[str, Any]] = ()) -> None:
        self.seed = seed
        self.n_startup = n_startup
        self.warm_start = list(warm_start)
        self.priors = list(priors)

    def _prior_trials(self, history: Sequence[Any], target: TargetSpec, dists: dict[str, Any]) -> list[Any]:
        """The priors as Optuna trials, or none once they stopped fitting this run."""
        if not self.priors:
            return []
        warm = [t for t in history if (t.rationale or "").startswith("warm start") and t.status in _FINISHED]
        if any(t.status not in ("kept", "discarded") or (t.score or 0.0) <= 1.0 for t in warm):
            return []  # the transferred winner lost here: the setting differs more than its similarity said
        own = sum(1 for t in history if t.number and t.status in ("kept", "discarded") and t.score)
        if own >= round(PRIOR_HORIZON * max(p["weight"] for p in self.priors)):
            return []
        out = []
        for p in self.priors:
            knobs = p["knobs"]
            if not set(knobs) <= set(dists) or active_only(target, knobs) != knobs:
                continue
            out.append(optuna.trial.create_trial(params=knobs, distributions={k: dists[k] for k in knobs},
                                                 value=float(p["score"]) or FAILED_VALUE))
        return out

    def propose(self, history: Sequence[Any], target: TargetSpec) -> Candidate | None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        dists = distributions(target)
        # A different seed per step keeps proposals reproducible for a given history.
        # constant_liar: trials still running on other hosts of a pool count as bad guesses, so
        # several proposals asked at once spread out instead of piling onto one region.
        sampler = optuna.samplers.TPESampler(seed=self.seed + len(history), n_startup_trials=self.n_startup,
                                             constant_liar=True)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.add_trials(self._prior_trials(history, target, dists))
        seen = set()
        for t in history:
            if t.proposer == "confirm":
                continue
            seen.add(knob_key(t.knobs))
            # Conditional knobs: a trial carries only its active knobs (define-by-run).
            if not set(t.knobs) <= set(dists) or active_only(target, t.knobs) != t.knobs:
                continue
            if t.status not in _FINISHED:  # in flight on a pool's other host
                study.add_trial(optuna.trial.create_trial(params=t.knobs, distributions={k: dists[k] for k in t.knobs},
                                                          state=optuna.trial.TrialState.RUNNING))
                continue
            value = t.score if t.status in ("kept", "discarded") and t.score else FAILED_VALUE
            study.add_trial(optuna.trial.create_trial(params=t.knobs, distributions={k: dists[k] for k in t.knobs}, value=value))
        for knobs in self.warm_start:
            try:
                knobs = target.validate_knobs(knobs)
            except ValueError:
                continue
            if knob_key(knobs) not in seen:
                return Candidate(knobs=knobs, rationale="warm start: a prior best from the knowledge base", proposer=self.name)
        # Skip knob sets already measured; a small space can run out, which ends the search.
        refused = refused_values(target, history)  # values the engine refused at start-up (bad_flag)
        for _ in range(50):
            trial = study.ask()
            params = _suggest(trial, target, dists)
            try:  # constraints between knobs: a combination that cannot start is never proposed
                target.validate_knobs(params)
            except ConstraintViolated:
                study.tell(trial, FAILED_VALUE)
                continue
            if any((k, repr(v)) in refused for k, v in params.items()):
                study.tell(trial, FAILED_VALUE)
                continue
            if knob_key(params) not in seen:
                return Candidate(
                    knobs=params,
                    rationale=f"TPE proposal after {len(study.trials) - 1} observed trials",
                    proposer=self.name,
                )
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return None


def _suggest(trial: optuna.trial.Trial, target: TargetSpec, dists: dict[str, Any]) -> dict[str, Any]:
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
