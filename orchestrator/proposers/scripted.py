"""ScriptedProposer: replays a fixed list of knob sets — deterministic, for tests and replays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.core.candidate import Candidate
from orchestrator.targets import TargetSpec

__all__ = ["ScriptedProposer"]


class ScriptedProposer:
    """Proposes `steps[i]` for the i-th non-baseline trial; then nothing.

    Each step is a knob dict, or `{"knobs": {...}, "rationale": "...", "commit": "..."}`.
    Position comes from the history, not from internal state, so a resumed run continues
    exactly where the killed one stopped.
    """

    name = "scripted"

    def __init__(self, steps: Sequence[dict[str, Any]]) -> None:
        self.steps = list(steps)

    def should_stop_early(self, history: Sequence[Any], value: float, margin: float,
                          startup: int | None = None) -> str | None:
        """Never: a scripted run measures every step in full."""
        return None

    def propose(self, history: Sequence[Any], target: TargetSpec) -> Candidate | None:
        done = sum(1 for t in history if t.number > 0)
        if done >= len(self.steps):
            return None
        step = self.steps[done]
        if "knobs" in step:
            return Candidate(
                knobs=dict(step["knobs"]), commit=step.get("commit"),
                rationale=step.get("rationale", f"scripted step {done + 1}"), proposer=self.name,
            )
        return Candidate(knobs=dict(step), rationale=f"scripted step {done + 1}", proposer=self.name)
