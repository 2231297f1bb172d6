"""What a proposer hands the loop: `Candidate`, and `knob_key`, the one identity of a knob set."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Candidate", "knob_key"]


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


def knob_key(knobs: dict[str, Any]) -> str:
    """A knob set's identity, for "measured already?": equal knob sets give equal keys, whatever their order."""
    return json.dumps(knobs, sort_keys=True, default=str)
