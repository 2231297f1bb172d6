"""Contracts change only through a person: the loop writes a pending proposal, `infergoal kb approve` accepts it.

Every proposal, approval and rejection is an audit event in the store (`kb.propose`, `kb.approve`,
`kb.reject`, with who and the entry id).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from orchestrator.knowledge.entries import Entry, parse_entry, render

__all__ = ["ApprovalError", "approve", "pending", "propose_contract", "reject"]


class ApprovalError(ValueError):
    """No such pending proposal, or a proposal that is not a contract."""


def _pending_dir(write_dir: Path) -> Path:
    return Path(write_dir) / "pending"


def pending(write_dir: Path) -> list[Entry]:
    d = _pending_dir(write_dir)
    return [parse_entry(f) for f in sorted(d.glob("*.md"))] if d.is_dir() else []


def propose_contract(write_dir: Path, meta: dict[str, Any], body: str, *, reason: str, store: Any = None,
                     run_id: int | None = None, who: str = "loop") -> Path:
    """Write a contract proposal to `pending/`; nothing under `contracts/` changes until approved."""
    if meta.get("kind") != "contract" or not meta.get("id"):
        raise ApprovalError("a proposal must be a contract with an id (kind: contract, id: contract-...)")
    today = dt.date.today().isoformat()
    meta = {**meta, "status": "pending", "proposed_by": who, "reason": reason, "updated": today}
    meta.setdefault("created", today)
    path = _pending_dir(write_dir) / f"{meta['id']}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(meta, body))
    if store is not None:
        store.add_event(run_id, "kb.propose", f"contract proposal {meta['id']}: {reason}", data={"id": meta["id"], "who": who})
    return path


def _find(write_dir: Path, entry_id: str) -> Path:
    path = _pending_dir(write_dir) / f"{entry_id}.md"
    if not path.is_file():
        ids = [e.id for e in pending(write_dir)]
        raise ApprovalError(f"no pending proposal {entry_id!r}; pending: {ids or 'none'} (see `infergoal kb list --pending`)")
    return path


def approve(write_dir: Path, entry_id: str, *, who: str, store: Any = None) -> Path:
    """Move the proposal into `contracts/` as `confirmed`, recording who approved it."""
    src = _find(write_dir, entry_id)
    e = parse_entry(src)
    meta = {k: v for k, v in e.meta.items() if k not in ("proposed_by", "reason")}
    meta.update(status="confirmed", approved_by=who, updated=dt.date.today().isoformat())
    dst = Path(write_dir) / "contracts" / f"{entry_id}.md"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(render(meta, e.body))
    src.unlink()
    if store is not None:
        store.add_event(None, "kb.approve", f"contract {entry_id} approved by {who}", data={"id": entry_id, "who": who, "path": str(dst)})
    return dst


def reject(write_dir: Path, entry_id: str, *, who: str, reason: str = "", store: Any = None) -> None:
    src = _find(write_dir, entry_id)
    src.unlink()
    if store is not None:
        store.add_event(None, "kb.reject", f"contract proposal {entry_id} rejected by {who}" + (f": {reason}" if reason else ""),
                        data={"id": entry_id, "who": who, "reason": reason})
