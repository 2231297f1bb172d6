"""The search's cost model: each candidate's score predicted before it is deployed, per knob level.

log(score) = the run's level + the sum of the candidate's knob-level effects: a categorical or bool
knob has one effect per level other than its default, an int or float knob one slope on its log2
value. Before a trial measured anything, each effect is the target's prior (`Knob.prior`, data in
the target's TOML: what the level does to bytes moved, launches and batch, from the engine's measured
steps); every measured trial corrects it: the effects are refitted by ridge least squares on the
run's scored trials around the prior (a multiplicative correction per level, log(measured/predicted)),
so a level no trial carried keeps its prior and a level measured once moves part of the way.

The search ranks proposals by it (`SearchProposer`): a screening level for which candidate to deploy
next, never a verdict (claims stay paired measurements).

A goal with several objectives steers by its bars once a paired confirmation missed one (`GoalAim`, set by
the loop from `orchestrator.trial.goalbars`): `GoalModel` then fits each objective's log speedup the same
way, around the same prior (a level no trial carried is expected to move every objective as it moves the
score), and ranks a knob set by its predicted goal margin (min over the objectives of predicted speedup /
bar) while that is under 1, by its predicted score among knob sets predicted to clear every bar.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.trial.goalbars import goal_margin

__all__ = ["RIDGE", "CostModel", "GoalAim", "GoalModel", "prior_effects"]

# How many trials' worth of evidence the prior counts as, per effect.
RIDGE = 1.0


def _numeric(target: Any) -> frozenset[str]:
    return frozenset(k for k, v in target.knobs.items() if v.type in ("int", "float") and (v.low or 0) > 0)


def _features(knobs: dict[str, Any], defaults: dict[str, Any], numeric: frozenset[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in knobs.items():
        if k in numeric:
            out[f"log2 {k}"] = math.log2(max(float(v), 1e-9))
        elif v != defaults.get(k):
            out[f"{k}={v}"] = 1.0
    return out


def prior_effects(target: Any) -> dict[str, float]:
    """Feature -> its prior effect on log(score), from the knobs' `prior` (absent: 0, a multiplier of 1)."""
    out: dict[str, float] = {}
    for name, knob in target.knobs.items():
        p = getattr(knob, "prior", None)
        if p is None:
            continue
        if isinstance(p, dict):
            for level, mult in p.items():
                out[f"{name}={level}"] = math.log(float(mult))
        else:
            out[f"log2 {name}"] = math.log(float(p))
    return out


class CostModel:
    """Fitted on `history`'s kept and discarded trials with a score, around the target's prior; `values`
    (trial number -> a positive value, e.g. one objective's speedup): fitted on those instead, for the trials it names.
    `joint`: the run's level is fitted with the effects (least squares, not penalized), not first as the mean of
    the corrections: on a run whose trials nearly all carry one level (the faster engine) the mean would take that
    level's effect for the run's, and the baseline's error would move the slopes (`GoalModel`'s fits)."""

    def __init__(self, target: Any, history: Sequence[Any], values: Mapping[int, float] | None = None,
                 joint: bool = False) -> None:
        self.defaults = {k: v.default for k, v in target.knobs.items()}
        self.numeric = _numeric(target)
        self.prior = prior_effects(target)
        scored = [t for t in history if t.status in ("kept", "discarded") and t.score and float(t.score) > 0
                  and (values is None or (values.get(t.number) or 0) > 0)]
        rows = [_features(t.knobs, self.defaults, self.numeric) for t in scored]
        self.weights = dict(self.prior)
        self.level = 0.0
        if not scored:
            return
        names = sorted({n for r in rows for n in r})
        x = np.zeros((len(rows), len(names)))
        for i, r in enumerate(rows):
            for n, v in r.items():
                x[i, names.index(n)] = v
        w0 = np.array([self.prior.get(n, 0.0) for n in names])
        # the correction: log(measured / predicted by the prior), its level first, then per feature
        y = np.log([float(t.score if values is None else values[t.number]) for t in scored]) - x @ w0
        if not joint:
            self.level = float(np.mean(y))
            delta = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(names)), x.T @ (y - self.level))
        else:  # the level fitted with the effects (centred: the ridge leaves it alone)
            mx = x.mean(axis=0)
            delta = np.linalg.solve((x - mx).T @ (x - mx) + RIDGE * np.eye(len(names)), (x - mx).T @ (y - y.mean()))
            self.level = float(y.mean() - mx @ delta)
        self.weights.update(zip(names, (w0 + delta).tolist(), strict=True))

    def predict(self, knobs: dict[str, Any]) -> float:
        """The predicted score of `knobs`."""
        f = _features(knobs, self.defaults, self.numeric)
        return math.exp(self.level + sum(self.weights.get(n, 0.0) * v for n, v in f.items()))

    def key(self, knobs: dict[str, Any]) -> tuple[float, float]:
        """As `GoalModel.key` ranks, without a goal: (1, the predicted score)."""
        return 1.0, self.predict(knobs)


@dataclass(frozen=True)
class GoalAim:
    """What the loop tells the search once a paired confirmation missed the goal (`trial.goalbars`)."""

    bars: dict[str, float]
    """Objective label -> the speedup a screen must clear (`Bars.bar`: the goal's, raised by the noise and the misses)."""
    ratios: dict[int, dict[str, float]]
    """Trial number -> its screening speedups per objective label (the baseline, trial 0: 1.0 each)."""

    def margin(self, speedups: Mapping[str, float]) -> float | None:
        """The goal margin of `speedups` against these bars (`goalbars.goal_margin`)."""
        return goal_margin(speedups, self.bars)


class GoalModel:
    """The score's `CostModel` and one per objective of `aim`, fitted on the same trials; `key` ranks a knob set."""

    def __init__(self, target: Any, history: Sequence[Any], aim: GoalAim) -> None:
        self.aim = aim
        self.score = CostModel(target, history)
        self.objectives = {k: CostModel(target, history, {n: r[k] for n, r in aim.ratios.items() if k in r}, joint=True)
                           for k in aim.bars}

    def speedups(self, knobs: dict[str, Any]) -> dict[str, float]:
        return {k: m.predict(knobs) for k, m in self.objectives.items()}

    def key(self, knobs: dict[str, Any]) -> tuple[float, float]:
        """(predicted goal margin capped at 1, predicted score): a knob set that clears every bar ranks above
        one that misses one, those that miss by their margin, those that clear by their score."""
        return min(self.aim.margin(self.speedups(knobs)) or 0.0, 1.0), self.score.predict(knobs)
