"""A per-knob multiplicative model of the score, refitted from every measured trial of the run.

log(score) = the run's mean + the sum of the candidate's knob-level effects (a categorical or bool
knob: one effect per level other than its default; an int or float knob: one slope on its log2 value),
fitted by ridge least squares on the run's scored trials, so a level no trial measured predicts as neutral
(x1) and a level measured once moves only part of the way. The search ranks TPE's proposals by it
(`SearchProposer(rank=...)`): a screening level for which candidate to deploy next, never a verdict
(claims stay paired measurements).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RIDGE", "CostModel"]

RIDGE = 1.0


def _features(knobs: dict[str, Any], defaults: dict[str, Any], numeric: frozenset[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in knobs.items():
        if k in numeric:
            out[f"log2 {k}"] = math.log2(max(float(v), 1e-9))
        elif v != defaults.get(k):
            out[f"{k}={v!r}"] = 1.0
    return out


class CostModel:
    """Fitted on `history`'s kept and discarded trials with a score; `predict` -> a multiplier of 1x."""

    def __init__(self, target: Any, history: Sequence[Any]) -> None:
        self.defaults = {k: v.default for k, v in target.knobs.items()}
        self.numeric = frozenset(k for k, v in target.knobs.items() if v.type in ("int", "float") and (v.low or 0) > 0)
        scored = [t for t in history if t.status in ("kept", "discarded") and t.score and t.score > 0]
        rows = [_features(t.knobs, self.defaults, self.numeric) for t in scored]
        self.names = sorted({n for r in rows for n in r})
        self.weights: dict[str, float] = {}
        self.mean = 0.0
        if not scored:
            return
        x = np.zeros((len(rows), len(self.names)))
        for i, r in enumerate(rows):
            for n, v in r.items():
                x[i, self.names.index(n)] = v
        y = np.log([float(t.score) for t in scored])
        self.mean = float(np.mean(y))
        w = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(self.names)), x.T @ (y - self.mean))
        self.weights = dict(zip(self.names, w.tolist(), strict=True))

    def predict(self, knobs: dict[str, Any]) -> float:
        """The predicted score of `knobs` (the run's mean for a knob set of unmeasured levels only)."""
        return math.exp(self.mean + sum(self.weights.get(n, 0.0) * v for n, v in _features(knobs, self.defaults, self.numeric).items()))
