"""Knowledge entries: markdown files with YAML frontmatter, and the status ladder they move on.

An entry's frontmatter carries `id, kind (contract | constraint | finding | playbook), title,
applies_to, status (refuted | hypothesis | probable | confirmed), evidence [...], created,
updated`; tuning findings add `knobs` and `speedup`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.frontmatter import read_frontmatter, render_frontmatter

__all__ = ["KINDS", "STATUS_RANK", "Entry", "demote", "parse_entry", "promote", "render"]

KINDS = ("contract", "constraint", "finding", "playbook")
STATUS_RANK = {"refuted": -1, "hypothesis": 0, "probable": 1, "confirmed": 2}
_LADDER = ["refuted", "hypothesis", "probable", "confirmed"]


def promote(status: str) -> str:
    """One step up (a confirmation); `confirmed` stays."""
    i = _LADDER.index(status) if status in _LADDER else 1
    return _LADDER[min(i + 1, len(_LADDER) - 1)]


def demote(status: str) -> str:
    """One step down (a contradiction on a similar setting); `refuted` stays."""
    i = _LADDER.index(status) if status in _LADDER else 1
    return _LADDER[max(i - 1, 0)]


@dataclass(frozen=True)
class Entry:
    path: Path
    meta: dict[str, Any]
    body: str

    @property
    def id(self) -> str:
        return str(self.meta.get("id", self.path.stem))

    @property
    def kind(self) -> str:
        return str(self.meta.get("kind", "finding"))

    @property
    def status(self) -> str:
        return str(self.meta.get("status", "hypothesis"))

    @property
    def applies_to(self) -> dict[str, Any]:
        return dict(self.meta.get("applies_to") or {})

    @property
    def title(self) -> str:
        return str(self.meta.get("title", self.id))


def parse_entry(path: Path) -> Entry:
    meta, body = read_frontmatter(path)
    return Entry(path=Path(path), meta=meta, body=body)


def render(meta: dict[str, Any], body: str) -> str:
    return render_frontmatter(meta, body)
