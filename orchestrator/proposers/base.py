"""The Proposer protocol and the Candidate it returns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.targets import TargetSpec

__all__ = ["Candidate", "Proposer", "get_proposer", "knob_key"]


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


def get_proposer(spec: str, *, seed: int = 0, warm_start: Sequence[dict[str, Any]] = ()) -> Proposer:
    """Pick a proposer by key: `search` (default), `scripted:FILE.json` (a list of knob dicts)."""
    from orchestrator.proposers.scripted import ScriptedProposer
    from orchestrator.proposers.search import SearchProposer

    if spec in ("", "search"):
        return SearchProposer(seed=seed, warm_start=warm_start)
    if spec.startswith("scripted:"):
        path = Path(spec.split(":", 1)[1])
        if not path.is_file():
            raise ValueError(f"scripted proposer file {path} does not exist")
        return ScriptedProposer(json.loads(path.read_text()))
    if spec in ("agent", "claude", "hybrid"):
        raise ValueError(f"proposer {spec!r} is not part of this release yet; use 'search' or 'scripted:FILE.json'")
    raise ValueError(f"unknown proposer {spec!r}; use 'search' or 'scripted:FILE.json'")
