"""The Proposer protocol and the Candidate it returns (`orchestrator.core.candidate`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from orchestrator.core.candidate import Candidate, knob_key
from orchestrator.targets import TargetSpec

__all__ = ["Candidate", "Proposer", "RunBound", "knob_key"]


class Proposer(Protocol):
    """Proposes the next candidate from the run's history; None means it has nothing left."""

    name: str

    def propose(self, history: Sequence[Any], target: TargetSpec) -> Candidate | None:
        """`history`: the run's TrialRecords so far (finished ones carry status and score)."""
        ...

    def should_stop_early(self, history: Sequence[Any], value: float, margin: float,
                          startup: int | None = None) -> str | None:
        """Multi-fidelity screening (`orchestrator.trial.fidelity`): a candidate's short bench scored `value`,
        give or take `margin` (relative: the short bench's noise); why it is not worth the full bench,
        or None to measure it in full. `startup`: full measurements to wait for before any is stopped
        (None: the proposer's own; the product's screen states the noise and passes 0). Proposers that
        do not screen return None. A proposer may also name its bar, `stop_bar(history, margin, startup)
        -> float | None` (every value under it stopped, as the search's ThresholdPruner does); only then
        may a screen stop a short pass early, once its score is certain to end under it."""
        ...


@runtime_checkable
class RunBound(Protocol):
    """A proposer that needs the run itself (the code agent: worktree, store, KB) before proposing."""

    def bind(self, ctx: Any, kb: Any) -> None:
        """`ctx`: the run's TrialContext; `kb`: its KnowledgeBase."""
        ...
