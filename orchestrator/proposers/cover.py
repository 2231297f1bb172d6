"""The covering start-up design (`SearchProposer(startup="cover")`): start-up trials that spread over every knob's levels.

Of STARTUP_POOL random knob sets, `cover` proposes the one that tries the most knob levels no trial of the run
tried yet (`coverage`; a numeric knob's level is a third of its (log) range: `level`), so a few start-up trials
spread over every knob's values instead of repeating some and missing others. A draw stakes at most
`max_untried` levels no served trial carried (`capped`), and with the cost model a draw it predicts under
SCREEN_PREDICTED of the best measured score is proposed only when no other draw is admissible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import optuna

from orchestrator.core.candidate import Candidate, knob_key
from orchestrator.proposers import multiobjective
from orchestrator.proposers.costmodel import CostModel
from orchestrator.proposers.optspace import suggest
from orchestrator.targets import TargetSpec
from orchestrator.targets.regions import FailedRegion, region_containing
from orchestrator.targets.space import active_only
from orchestrator.targets.spec import ConstraintViolated

__all__ = ["LEVEL_BINS", "SCREEN_PREDICTED", "STARTUP_POOL", "capped", "cover", "coverage", "level"]

# How many random knob sets "cover" draws to pick one start-up proposal from; numeric knobs count as
# tried per third of their (log) range.
STARTUP_POOL = 24
LEVEL_BINS = 3
# A start-up draw the cost model predicts under this fraction of the best measured score is not proposed
# while another draw is admissible: its untried levels are not worth a trial the model expects to lose.
SCREEN_PREDICTED = 0.5


def cover(history: Sequence[Any], target: TargetSpec, dists: dict[str, Any], seen: set[str],
          refused: set[tuple[str, str]], regions: Sequence[FailedRegion], *, seed: int, objectives: Sequence[Any],
          max_untried: int | None, rank: int, proposer: str) -> Candidate | None:
    """A start-up proposal that covers: of STARTUP_POOL random knob sets the loop may propose, the one
    with the most (knob, level) pairs that none of the run's trials tried (the first drawn on a tie);
    None when no draw is admissible (TPE's own start-up then asks)."""
    tried = {(k, level(dists[k], v)) for t in history for k, v in t.knobs.items() if k in dists}
    sampler = optuna.samplers.RandomSampler(seed=seed + len(history))
    pool = (optuna.create_study(directions=multiobjective.directions(objectives), sampler=sampler) if objectives
            else optuna.create_study(direction="maximize", sampler=sampler))
    conditional = frozenset(k for k, spec in target.knobs.items() if spec.when)
    served = {(k, repr(v)) for t in history if t.status in ("kept", "discarded", "invalid") for k, v in t.knobs.items()}
    model = CostModel(target, history) if rank > 1 else None
    # screened by the prediction: a draw the model puts under SCREEN_PREDICTED of the best measured score
    # covers levels the run has reason to expect nothing of (unless every draw is such)
    top = max((float(t.score) for t in history if t.status in ("kept", "discarded") and t.score), default=0.0)
    floor = SCREEN_PREDICTED * top if model is not None else 0.0
    low: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    best: tuple[tuple[int, int], dict[str, Any]] | None = None
    for _ in range(STARTUP_POOL):
        params = suggest(pool.ask(), target, dists)
        try:
            if max_untried is not None:
                params = capped(target, target.validate_knobs(params), served, max_untried)
            target.validate_knobs(params)
        except ConstraintViolated:
            continue
        if (knob_key(params) in seen or any((k, repr(v)) in refused for k, v in params.items())
                or region_containing(regions, params) is not None):  # a draw, not a proposal: not recorded
            continue
        new = coverage(params, tried, dists, conditional)
        # equal coverage: the knob set the cost model predicts highest (with `rank` > 1)
        key = (*new, model.predict(params) if model is not None else 0.0)
        if model is not None and key[2] < floor:
            if low is None or key[2] > low[0][2]:
                low = (key, params)
            continue
        if best is None or key > best[0]:
            best = (key, params)
    best = best or low
    if best is None:
        return None
    return Candidate(knobs=best[1], proposer=proposer,
                     rationale=f"start-up proposal {len(history)}{' (multi-objective search)' if objectives else ''}: "
                               f"of {STARTUP_POOL} random knob sets, the one "
                               f"trying the most knob levels not tried yet ({best[0][0]} + {best[0][1]} conditional)"
                               + (f", the cost model's pick of those ({best[0][2]:.2f}x)" if model is not None else ""))


def capped(target: TargetSpec, knobs: dict[str, Any], served: set[tuple[str, str]], cap: int) -> dict[str, Any]:
    """`knobs` with its untried levels past the first `cap` (a knob's default and levels a served trial
    carried are tried; the target's knob order: the top of the knob tree first) set to their defaults."""
    untried = [k for k in target.knobs if k in knobs and knobs[k] != target.knobs[k].default
               and (k, repr(knobs[k])) not in served]
    if len(untried) <= cap:
        return knobs
    out = dict(knobs) | {k: target.knobs[k].default for k in untried[cap:]}
    return active_only(target, {k: v.default for k, v in target.knobs.items()} | out)


def level(d: optuna.distributions.BaseDistribution, value: Any) -> Any:
    """The level a knob value counts as for coverage: the value itself, or a numeric knob's third of its range."""
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return repr(value)
    lo, hi, v = float(d.low), float(d.high), float(value)
    if getattr(d, "log", False) and lo > 0:
        lo, hi, v = math.log(lo), math.log(hi), math.log(max(v, lo))
    return min(LEVEL_BINS - 1, int(LEVEL_BINS * (v - lo) / (hi - lo))) if hi > lo else 0


def coverage(knobs: dict[str, Any], tried: set[tuple[str, Any]], dists: dict[str, Any],
             conditional: frozenset[str] = frozenset()) -> tuple[int, int]:
    """How many of `knobs`' (knob, level) pairs no trial tried yet: (among the knobs that always exist,
    among the conditional ones). Compared in that order, so the top of the knob tree is covered first:
    otherwise a value that switches on many conditional knobs (an engine with its own options) would
    win every draw, and the values that switch on few would never be tried."""
    new = [k for k, v in knobs.items() if k in dists and (k, level(dists[k], v)) not in tried]
    return sum(1 for k in new if k not in conditional), sum(1 for k in new if k in conditional)
