"""The agent's conversation, persisted in the run dir after every change (atomic replace).

`infergoal resume` after a kill -9 loads it and goes on: a run_trial still waiting for its
result is answered with the stored trial's outcome; tool calls the kill interrupted are run
again (an edit already applied then fails as "not found", which the agent handles).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Conversation"]


@dataclass
class Conversation:
    path: Path
    messages: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None
    """The run_trial waiting for its outcome: tool_use id, the candidate, results of its sibling calls."""
    finished: str | None = None
    """The summary given with `finish`, once the agent finished."""
    usage: dict[str, Any] = field(default_factory=dict)
    """Running totals of tokens and dollars."""
    steer_seen: int = 0
    """Highest `steer` event id already shown to the agent."""
    last_context_tokens: int = 0
    compactions: int = 0

    @classmethod
    def load(cls, path: Path) -> Conversation:
        path = Path(path)
        if path.is_file():
            data = json.loads(path.read_text())
            return cls(path=path, **data)
        return cls(path=path)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, default=str))
        os.replace(tmp, self.path)

    def unanswered_tool_uses(self) -> list[dict[str, Any]]:
        """tool_use blocks of the last message, when it is the assistant's (a kill cut their results)."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return []
        return [b for b in self.messages[-1]["content"] if b.get("type") == "tool_use"]
