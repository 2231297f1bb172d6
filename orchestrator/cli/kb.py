"""`infergoal kb ...`: list, search, show, lint, export the knowledge base; approve or reject contract proposals.

The loop never edits contracts; it writes proposals under `<kb>/pending/`. A person accepts one
with `infergoal kb approve ID` (or drops it with `reject`); both are audit events in the store.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from orchestrator.cli.common import get_store, get_workspace, whoami
from orchestrator.cli.errors import fail
from orchestrator.knowledge import KnowledgeBase
from orchestrator.knowledge.approval import ApprovalError, approve, pending, reject
from orchestrator.knowledge.lint import lint

__all__ = ["kb_app"]

kb_app = typer.Typer(help="Read and curate the knowledge base; approve contract proposals.", no_args_is_help=True)


def _kb() -> KnowledgeBase:
    ws = get_workspace()
    try:
        return KnowledgeBase(ws.kb_read_dirs, write_dir=ws.kb_write_dir)
    except ValueError as e:
        fail(f"{e} (run `infergoal kb lint` to see every problem)")


def _row(e: Any, weight: float | None = None) -> str:
    a = e.applies_to
    where = " ".join(f"{k}={a[k]}" for k in ("engine", "model", "hardware", "workload") if a.get(k))
    w = f" [{weight:.2f}]" if weight is not None else ""
    return f"{e.id}{w}  ({e.kind}, {e.status})  {e.title}" + (f"  <{where}>" if where else "")


@kb_app.command("list")
def list_(kind: str | None = typer.Option(None, "--kind", "-k", help="contract | constraint | finding | playbook"),
          show_pending: bool = typer.Option(False, "--pending", help="List contract proposals waiting for approval.")) -> None:
    """List entries (or the pending contract proposals)."""
    kb = _kb()
    rows = pending(kb.write_dir) if show_pending else [e for e in kb.entries.values() if not kind or e.kind == kind]
    for e in sorted(rows, key=lambda e: (e.kind, e.id)):
        print(_row(e))
    if not rows:
        print("(none)")


@kb_app.command()
def search(query: str = typer.Argument("", help="Words to look for in titles and bodies (empty: all)."),
           engine: str | None = typer.Option(None, "--engine"), model: str | None = typer.Option(None, "--model"),
           kind: str | None = typer.Option(None, "--kind", "-k")) -> None:
    """Entries that fit an engine/model (on this host), by similarity x status, filtered by words."""
    kb = _kb()
    ws = get_workspace()
    from orchestrator.hosts import get_host

    fp = get_host(ws.config.host, state_dir=ws.state_dir).fingerprint()
    here = kb.setting(engine=engine or "*", model=model, hardware=fp)
    if not engine:
        here.pop("engine")
    words = [w.lower() for w in query.split()]
    hits = [(w, e) for w, e in kb.similar(here, kind=kind)
            if all(x in (e.title + " " + e.body).lower() for x in words)]
    for w, e in hits:
        print(_row(e, w))
    if not hits:
        print("(no matching entries)")


@kb_app.command()
def show(entry_id: str) -> None:
    """One entry in full (frontmatter and body)."""
    kb = _kb()
    e = kb.entries.get(entry_id) or next((p for p in pending(kb.write_dir) if p.id == entry_id), None)
    if e is None:
        fail(f"no entry {entry_id!r}; see `infergoal kb list`")
    print(e.path.read_text())


@kb_app.command("lint")
def lint_() -> None:
    """Check every entry (seed and workspace); exit 1 on problems."""
    ws = get_workspace()
    problems = lint(ws.kb_read_dirs)
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)" if problems else "knowledge base OK")
    if problems:
        raise typer.Exit(1)


@kb_app.command()
def export(out: Path | None = typer.Option(None, "--out", "-o", help="Write JSON here (default: stdout).")) -> None:
    """Every entry as JSON (id, kind, status, applies_to, the rest of the frontmatter, body)."""
    kb = _kb()
    data = [{**e.meta, "body": e.body.strip(), "path": str(e.path)} for e in sorted(kb.entries.values(), key=lambda e: e.id)]
    text = json.dumps(data, indent=1, default=str) + "\n"
    if out:
        out.write_text(text)
        print(f"{len(data)} entries -> {out}")
    else:
        sys.stdout.write(text)


@kb_app.command("approve")
def approve_contract(entry_id: str) -> None:
    """Accept a contract proposal: it moves into contracts/ as confirmed (audited as `kb.approve`)."""
    ws = get_workspace()
    try:
        path = approve(ws.kb_write_dir, entry_id, who=whoami(), store=get_store())
    except ApprovalError as e:
        fail(str(e))
    print(f"approved: {path}")


@kb_app.command("reject")
def reject_contract(entry_id: str, reason: str = typer.Option("", "--reason", help="Why (recorded in the audit event).")) -> None:
    """Drop a contract proposal (audited as `kb.reject`)."""
    ws = get_workspace()
    try:
        reject(ws.kb_write_dir, entry_id, who=whoami(), reason=reason, store=get_store())
    except ApprovalError as e:
        fail(str(e))
    print(f"rejected: {entry_id}")
