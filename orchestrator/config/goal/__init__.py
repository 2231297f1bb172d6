"""Goals: the model (`spec`: `GoalSpec` and its parts) and how one is read from text or TOML (`parse`)."""

from orchestrator.config.goal import parse, spec
from orchestrator.config.goal.parse import *  # noqa: F403 - as parse.__all__ names them
from orchestrator.config.goal.spec import *  # noqa: F403 - as spec.__all__ names them

__all__ = [*parse.__all__, *spec.__all__]
