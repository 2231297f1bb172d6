"""Proposers: where candidates come from. Search (Optuna) and scripted (replay) today."""

from orchestrator.proposers.base import Candidate, Proposer, get_proposer
from orchestrator.proposers.scripted import ScriptedProposer
from orchestrator.proposers.search import SearchProposer

__all__ = ["Candidate", "Proposer", "ScriptedProposer", "SearchProposer", "get_proposer"]
