"""Exit codes of the `infergoal` command, and how a run's stop maps onto them.

| code | outcome          | meaning                                                                |
|------|------------------|------------------------------------------------------------------------|
| 0    | `goal_met`       | the goal was met and confirmed (or a non-run command succeeded)        |
| 1    | `stopped`        | the run stopped on its budget, a stall or an exhausted search, goal not met |
| 2    | `bad_input`      | the request was refused before anything ran; nothing was created       |
| 3    | `gates_tampered` | a gate file differs from gates.lock; the run stopped                   |
| 4    | `failed`         | the run failed (e.g. the baseline could not be served) or an internal error |
| 5    | `busy`           | a live run holds the run or the host (the run lease)                   |
| 130  | `interrupted`    | Ctrl-C; the run is saved and `infergoal resume` continues it           |
"""

from __future__ import annotations

__all__ = ["EXIT_CODES", "classify_stop"]

EXIT_CODES: dict[str, int] = {
    "goal_met": 0,
    "stopped": 1,
    "bad_input": 2,
    "gates_tampered": 3,
    "failed": 4,
    "busy": 5,
    "interrupted": 130,
}

_STOPPED = ("BudgetExhausted", "Stalled", "ProposerExhausted")


def classify_stop(stop_reason: str) -> str:
    """The outcome of a run from its stop reason (`<StopClass>: message`, see controller.py)."""
    kind = stop_reason.split(":", 1)[0].strip()
    if kind == "GoalMet":
        return "goal_met"
    if kind in _STOPPED:
        return "stopped"
    if kind == "GateTampered":
        return "gates_tampered"
    return "failed"
