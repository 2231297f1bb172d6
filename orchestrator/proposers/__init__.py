"""Proposers: where candidates come from: search (Optuna), scripted (replay), claude (the code agent), hybrid.

`get_proposer` picks one by key. The agent and hybrid proposers are imported when asked for:
they bring the Anthropic client, which a search run does not need.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.proposers.base import Candidate, Proposer, RunBound
from orchestrator.proposers.scripted import ScriptedProposer
from orchestrator.proposers.search import SearchProposer

__all__ = ["Candidate", "Proposer", "RunBound", "ScriptedProposer", "SearchProposer", "get_proposer"]


def get_proposer(
    spec: str, *, seed: int = 0, warm_start: Sequence[dict[str, Any]] = (), agent: Any = None,
    priors: Sequence[dict[str, Any]] = (), objectives: Sequence[Any] = (), warm_from: Sequence[str] = (),
) -> Proposer:
    """Pick a proposer by key: `search` (default), `scripted:FILE.json` (a list of knob dicts),
    `claude` (the code agent; `agent` is its AgentConfig) or `hybrid` (agent + knob search).
    `objectives`: two of them make the search multi-objective (a goal with a Pareto front); `warm_from`: the
    knowledge-base entry of each `warm_start` knob set, which its trial's rationale names."""
    if spec in ("", "search"):
        return SearchProposer(seed=seed, warm_start=warm_start, priors=priors, objectives=objectives, warm_from=warm_from)
    if spec.startswith("scripted:"):
        path = Path(spec.split(":", 1)[1])
        if not path.is_file():
            raise ValueError(f"scripted proposer file {path} does not exist")
        return ScriptedProposer(json.loads(path.read_text()))
    if spec in ("agent", "claude", "hybrid"):
        # On demand: the agent brings the Anthropic client, which a search run does not need.
        from orchestrator.agent.config import AgentConfig
        from orchestrator.proposers.agent import AgentProposer
        from orchestrator.proposers.hybrid import HybridProposer

        cfg = agent if agent is not None else AgentConfig()
        claude = AgentProposer(cfg)
        return claude if spec != "hybrid" else HybridProposer(claude, seed=seed, n_tune=cfg.hybrid_search_trials,
                                                              objectives=objectives)
    raise ValueError(f"unknown proposer {spec!r}; use search, claude, hybrid or scripted:FILE.json")
