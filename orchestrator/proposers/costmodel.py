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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RIDGE", "CostModel", "prior_effects"]

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
    """Fitted on `history`'s kept and discarded trials with a score, around the target's prior."""

    def __init__(self, target: Any, history: Sequence[Any]) -> None:
        self.defaults = {k: v.default for k, v in target.knobs.items()}
        self.numeric = _numeric(target)
        self.prior = prior_effects(target)
        scored = [t for t in history if t.status in ("kept", "discarded") and t.score and float(t.score) > 0]
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
        y = np.log([float(t.score) for t in scored]) - x @ w0
        self.level = float(np.mean(y))
        delta = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(names)), x.T @ (y - self.level))
        self.weights.update(zip(names, (w0 + delta).tolist(), strict=True))

    def predict(self, knobs: dict[str, Any]) -> float:
        """The predicted score of `knobs`."""
        f = _features(knobs, self.defaults, self.numeric)
        return math.exp(self.level + sum(self.weights.get(n, 0.0) * v for n, v in f.items()))
