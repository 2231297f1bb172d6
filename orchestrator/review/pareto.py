"""The Pareto front of a run: its measured trials that no other measured trial beats on every objective.

Measured: kept, or discarded on a full measurement with every gate passed (the keep rule is the
geometric mean of the two speedups, so a real trade-off — the lowest latency at a lower throughput —
can be discarded and still be on the front). Not measured: trials screened out on a short bench (a
lower-fidelity number), probes, failures, gate rejections, and measurements of a trial.

A goal with two objectives and no targets ("maximize throughput and minimize p90 TPOT") has no
single answer: the run's answer is the front, the trade-offs between them. The front is a query
over what the store holds (each measured trial's objective values, `trials.objective_json`),
never a decision of its own, so it is computed here, by `non_dominated`, and every face (the
`trials` table and its `--json`, the report's plot, the knowledge base) reads it through `run_front`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.config.goal import GoalSpec, Objective
from orchestrator.core.roles import PROBE
from orchestrator.review.trials import is_measurement
from orchestrator.trial.context import objective_label

__all__ = ["Front", "front_of", "measured", "non_dominated", "run_front"]


def non_dominated(points: Sequence[Mapping[str, Any]], directions: Mapping[str, str]) -> list[Mapping[str, Any]]:
    """The points no other point dominates, in their given order.

    `directions`: key -> "maximize" | "minimize", the keys each point is compared on. A point is
    dominated when another is at least as good on every key and better on one; points equal on
    every key all stay (neither beats the other)."""

    def at_least(q: Mapping[str, Any], p: Mapping[str, Any]) -> bool:
        return all(q[k] >= p[k] if d == "maximize" else q[k] <= p[k] for k, d in directions.items())

    return [p for p in points if not any(at_least(q, p) and any(q[k] != p[k] for k in directions) for q in points)]


class Front:
    """A run's Pareto front: the objectives it is over, every measured trial's point, and the members."""

    def __init__(self, objectives: Sequence[Objective], points: list[dict[str, Any]], members: list[dict[str, Any]]):
        self.objectives = list(objectives)
        self.labels = [objective_label(o.scenario, o.key) for o in objectives]
        self.points = points
        """{"number", "status", label: value...} for each measured trial with both values, by number."""
        self.members = members
        """The points on the front, by the first objective's value."""

    @property
    def numbers(self) -> set[int]:
        return {p["number"] for p in self.members}

    def to_dict(self) -> dict[str, Any]:
        return {"objectives": [{"label": lab, "describe": o.describe(), "direction": o.info.direction, "unit": o.info.unit}
                               for lab, o in zip(self.labels, self.objectives, strict=True)],
                "front": [p["number"] for p in self.members], "points": self.points}


def measured(t: Any) -> bool:
    """Kept, or discarded on its full measurement (gates passed, not screened out, not a probe)."""
    if is_measurement(t) or t.proposer == PROBE:
        return False
    return t.status == "kept" or (t.status == "discarded" and not t.error)


def front_of(trials: Sequence[Any], objectives: Sequence[Objective]) -> Front:
    """The front over `trials` (store trial records): the measured ones (`measured`) whose stored
    objective values name every objective."""
    labels = [objective_label(o.scenario, o.key) for o in objectives]
    points = [{"number": t.number, "status": t.status, **{lab: float(t.objective[lab]) for lab in labels}}
              for t in sorted(trials, key=lambda t: t.number)
              if measured(t) and all(lab in (t.objective or {}) for lab in labels)]
    members = non_dominated(points, {lab: o.info.direction for lab, o in zip(labels, objectives, strict=True)})
    return Front(objectives, points, sorted(members, key=lambda p: (p[labels[0]], p["number"])))  # type: ignore[arg-type]


def run_front(store: Any, run_id: int) -> Front | None:
    """The run's front, or None when its goal does not trade off two objectives."""
    run = store.get_run(run_id)
    if run is None:
        return None
    goal = GoalSpec.model_validate(run.goal)
    if not goal.multi_objective:
        return None
    return front_of(store.list_trials(run_id), goal.objectives)
