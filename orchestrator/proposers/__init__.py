"""Proposers: where candidates come from: search (Optuna), scripted (replay), claude (the code agent), hybrid.

The agent and hybrid proposers are imported from their modules (`orchestrator.proposers.agent`,
`.hybrid`), not here: they import the controller, which imports this package.
"""

from orchestrator.proposers.base import Candidate, Proposer, RunBound, get_proposer
from orchestrator.proposers.scripted import ScriptedProposer
from orchestrator.proposers.search import SearchProposer

__all__ = ["Candidate", "Proposer", "RunBound", "ScriptedProposer", "SearchProposer", "get_proposer"]
