"""Scores: per-scenario speedup over a baseline, geometric mean across scenarios (D).

A failed or missing candidate run scores 1.0× (no credit, no penalty), as in InferenceBench.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal

from .results import ScenarioResult


def speedup(metric_name: str, cand_value: float | None, base_value: float | None,
            direction: Literal["lower", "higher"]) -> float:
    """Baseline/candidate for lower-is-better metrics, candidate/baseline for higher-is-better.

    Returns 1.0 when either value is missing, non-finite or non-positive (a failed trial).
    ``metric_name`` is only used in error messages.
    """
    if direction not in ("lower", "higher"):
        raise ValueError(f"{metric_name}: direction must be 'lower' or 'higher'")
    if cand_value is None or base_value is None:
        return 1.0
    c, b = float(cand_value), float(base_value)
    if not (math.isfinite(c) and math.isfinite(b)) or c <= 0 or b <= 0:
        return 1.0
    return b / c if direction == "lower" else c / b


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values (1.0 for an empty input)."""
    vals = [float(v) for v in values]
    if not vals:
        return 1.0
    if any(v <= 0 or not math.isfinite(v) for v in vals):
        raise ValueError("geomean needs positive finite values")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def scenario_speedup(cand: ScenarioResult | None, base: ScenarioResult | None) -> float:
    """Speedup on the scenario's primary metric; 1.0 if the candidate failed any request."""
    if cand is None or base is None or not cand.ok or not base.ok:
        return 1.0
    sc = base.scenario
    return speedup(sc.primary_metric, cand.metrics.get(sc.primary_metric),
                   base.metrics.get(sc.primary_metric), sc.direction)


def score(candidate: Mapping[str, ScenarioResult | None],
          baseline: Mapping[str, ScenarioResult | None]) -> dict[str, float]:
    """Per-scenario speedups plus ``geomean`` (scenario D) over the baseline's scenarios."""
    out = {name: scenario_speedup(candidate.get(name), base) for name, base in baseline.items()}
    out["geomean"] = geomean(out.values())
    return out
