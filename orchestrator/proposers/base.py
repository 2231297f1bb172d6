"""The Proposer protocol and the Candidate it returns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from orchestrator.targets import TargetSpec

__all__ = ["Candidate", "Proposer", "RunBound", "get_proposer", "knob_key"]


@dataclass(frozen=True)
class Candidate:
    """What to try next: a commit of the engine plus a knob set, and why."""

    knobs: dict[str, Any]
    commit: str | None = None
    """Engine commit; None = the run's base commit."""
    rationale: str = ""
    prediction: str | None = None
    """What the proposer expects to move, and by how much (checked against the result)."""
    proposer: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Proposer(Protocol):
    """Proposes the next candidate from the run's history; None means it has nothing left."""

    name: str

    def propose(self, history: Sequence[Any], target: TargetSpec) -> Candidate | None:
        """`history`: the run's TrialRecords so far (finished ones carry status and score)."""
        ...


def knob_key(knobs: dict[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True, default=str)


@runtime_checkable
class RunBound(Protocol):
    """A proposer that needs the run itself (the code agent: worktree, store, KB) before proposing."""

    def bind(self, ctx: Any, kb: Any) -> None:
        """`ctx`: the run's TrialContext; `kb`: its KnowledgeBase."""
        ...


def get_proposer(
    spec: str, *, seed: int = 0, warm_start: Sequence[dict[str, Any]] = (), agent: Any = None,
    priors: Sequence[dict[str, Any]] = (),
) -> Proposer:
    """Pick a proposer by key: `search` (default), `scripted:FILE.json` (a list of knob dicts),
    `claude` (the code agent; `agent` is its AgentConfig) or `hybrid` (agent + knob search)."""
    from orchestrator.proposers.scripted import ScriptedProposer
    from orchestrator.proposers.search import SearchProposer

    if spec in ("", "search"):
        return SearchProposer(seed=seed, warm_start=warm_start, priors=priors)
    if spec.startswith("scripted:"):
        path = Path(spec.split(":", 1)[1])
        if not path.is_file():
            raise ValueError(f"scripted proposer file {path} does not exist")
        return ScriptedProposer(json.loads(path.read_text()))
    if spec in ("agent", "claude", "hybrid"):
        # Imported here: the agent imports the controller, which imports this package.
        from orchestrator.agent.config import AgentConfig
        from orchestrator.proposers.agent import AgentProposer
        from orchestrator.proposers.hybrid import HybridProposer

        cfg = agent if agent is not None else AgentConfig()
        claude = AgentProposer(cfg)
        return claude if spec != "hybrid" else HybridProposer(claude, seed=seed, n_tune=cfg.hybrid_search_trials)
    raise ValueError(f"unknown proposer {spec!r}; use search, claude, hybrid or scripted:FILE.json")
