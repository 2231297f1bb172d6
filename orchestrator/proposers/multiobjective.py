"""What a multi-objective search is told: one value per objective, in the goal's directions.

A goal that trades off two objectives ("maximize throughput and minimize p90 TPOT",
`GoalSpec.multi_objective`) is searched with Optuna's multi-objective TPE (MOTPE): the study has
one direction per objective and each finished trial reports its measured objective values, not
the scalar score, so the sampler models the front rather than one geometric mean. The keep rule
stays the loop's (`orchestrator.loop.controller`); the front is read from the store
(`orchestrator.review.pareto`). This module only translates stored trials into sampler values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.config.goal import Objective
from orchestrator.trial.context import objective_label

__all__ = ["FAILED_FACTOR", "directions", "failed_values", "sampler_options", "values_of"]

# A failed trial is told a value this many times worse than the worst one measured (a minimized
# latency), or 0 (a maximized rate): worse than any real result, yet finite, which MOTPE's
# hypervolume arithmetic needs.
FAILED_FACTOR = 10.0
_SCORED = ("kept", "discarded")


def sampler_options(objectives: Sequence[Objective]) -> dict[str, Any]:
    """Extra `TPESampler` options for a multi-objective study (none for one objective).

    `multivariate`: the sampler models the knobs jointly. On the replayed hfserve space
    (benchmarks/pareto_search.py, docs/results.md) both MOTPE variants kept a better front than the
    scalar search on the geometric mean, and multivariate MOTPE measured the better front over all
    its trials: a trade-off between throughput and TPOT runs through knob pairs (batch size only
    acts with batching on)."""
    if len(objectives) < 2:
        return {}
    return {"multivariate": True}


def directions(objectives: Sequence[Objective]) -> list[str]:
    """The study's directions, one per objective, in the goal's order."""
    return [o.info.direction for o in objectives]


def failed_values(history: Sequence[Any], objectives: Sequence[Objective]) -> list[float]:
    """What a failed, refused or constrained-out trial reports: worse than anything measured."""
    out = []
    for o in objectives:
        if o.info.direction == "maximize":
            out.append(0.0)
            continue
        label = objective_label(o.scenario, o.key)
        seen = [float(t.objective[label]) for t in history if label in (t.objective or {})]
        out.append(FAILED_FACTOR * max(seen, default=1.0))
    return out


def values_of(t: Any, objectives: Sequence[Objective], failed: list[float]) -> list[float]:
    """A finished trial's measured objective values; `failed` when it produced none (or not all)."""
    got = t.objective or {}
    labels = [objective_label(o.scenario, o.key) for o in objectives]
    if t.status not in _SCORED or not t.score or not all(lab in got for lab in labels):
        return list(failed)
    return [float(got[lab]) for lab in labels]
