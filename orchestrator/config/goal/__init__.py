"""Goals: the model (`spec`: `GoalSpec` and its parts) and how one is read from text or TOML (`parse`)."""

from orchestrator.config.goal.parse import ACCEPTED_FORMS, GoalError, load_goal, parse_goal
from orchestrator.config.goal.spec import (
    METRICS,
    SLO_METRICS,
    SLO_SCENARIO,
    STATS,
    Budget,
    Constraint,
    GoalSpec,
    MetricInfo,
    Objective,
    SloGoal,
    SloLimit,
)

__all__ = [
    "ACCEPTED_FORMS",
    "METRICS",
    "SLO_METRICS",
    "SLO_SCENARIO",
    "STATS",
    "Budget",
    "Constraint",
    "GoalError",
    "GoalSpec",
    "MetricInfo",
    "Objective",
    "SloGoal",
    "SloLimit",
    "load_goal",
    "parse_goal",
]
