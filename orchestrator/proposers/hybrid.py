"""HybridProposer: the agent changes the structure, a short Optuna search tunes its knobs.

After each agent trial that produced a valid measurement, `n_tune` TPE trials explore the knob
space on that same commit (the study sees only trials of that commit: a new structure has new
best knobs). Then the agent goes on; the answer to its `run_trial` lists the tuned trials, so it
sees what its structure was worth once tuned. Like the search proposer it is stateless: the
position comes from the stored history, so a resumed run continues where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.core.candidate import Candidate
from orchestrator.proposers.agent import AgentProposer
from orchestrator.proposers.search import SearchProposer
from orchestrator.targets import TargetSpec

__all__ = ["HybridProposer"]

TUNE = "search"
# An agent trial in these states has no structure worth tuning (it crashed or a gate rejected it).
_BROKEN = {"failed", "invalid", "rejected"}


class HybridProposer:
    """Alternates: one agent proposal, then up to `n_tune` knob-search proposals on its commit."""

    name = "hybrid"

    def __init__(self, agent: AgentProposer, *, seed: int = 0, n_tune: int = 3, objectives: Sequence[Any] = ()) -> None:
        self.agent, self.seed, self.n_tune = agent, seed, n_tune
        self.objectives = list(objectives)
        """A two-objective goal's objectives: the knob tuning is then multi-objective, as a search run's is."""

    def bind(self, ctx: Any, kb: Any) -> None:
        self.agent.bind(ctx, kb)

    def should_stop_early(self, history: Sequence[Any], value: float, margin: float,
                          startup: int | None = None) -> str | None:
        """Never: the agent's structures and their tuning are measured in full."""
        return None

    def propose(self, history: Sequence[Any], target: TargetSpec) -> Candidate | None:
        last = next((t for t in reversed(history) if t.proposer == self.agent.name), None)
        if last is not None and last.status not in _BROKEN and self.n_tune > 0:
            same = [t for t in history if t.commit == last.commit]
            tuned = [t for t in same if t.number > last.number and t.proposer == TUNE]
            if len(tuned) < self.n_tune:
                search = SearchProposer(seed=self.seed + last.number, n_startup=max(1, self.n_tune - 1),
                                        objectives=self.objectives)
                c = search.propose(same, target)
                if c is not None:
                    return Candidate(knobs=c.knobs, commit=last.commit, proposer=TUNE, extra=c.extra,
                                     rationale=f"knob search on the structure of trial #{last.number}: {c.rationale}")
        return self.agent.propose(history, target)
