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
from orchestrator.cli.errors import emit, fail
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


def _entry_dict(e: Any, weight: float | None = None) -> dict[str, Any]:
    return {"id": e.id, "kind": e.kind, "status": e.status, "title": e.title, "applies_to": e.applies_to,
            **({"weight": weight} if weight is not None else {}), "path": str(e.path)}


@kb_app.command("list")
def list_(kind: str | None = typer.Option(None, "--kind", "-k", help="contract | constraint | finding | playbook"),
          show_pending: bool = typer.Option(False, "--pending", help="List contract proposals waiting for approval."),
          as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON.")) -> None:
    """List entries (or the pending contract proposals)."""
    kb = _kb()
    rows = pending(kb.write_dir) if show_pending else [e for e in kb.entries.values() if not kind or e.kind == kind]
    rows = sorted(rows, key=lambda e: (e.kind, e.id))
    if as_json:
        return emit([_entry_dict(e) for e in rows])
    for e in rows:
        print(_row(e))
    if not rows:
        print("(none)")
    return None


@kb_app.command()
def search(query: str = typer.Argument("", help="Words to look for in titles and bodies (empty: all)."),
           engine: str | None = typer.Option(None, "--engine", help="Engine to rank for, e.g. vllm or hfserve (default: any engine)."),
           model: str | None = typer.Option(None, "--model", help="Model to rank for, e.g. forge:tiny or a model folder "
                                                              "(default: any model)."),
           kind: str | None = typer.Option(None, "--kind", "-k", help="Only this kind: contract | constraint | finding | playbook."),
           as_json: bool = typer.Option(False, "--json", help="Print the entries with their weights as JSON.")) -> None:
    """Entries that fit an engine/model (on this host), best first, filtered by words.

    Each line's [w] is the entry's weight for this setting: how well its engine, model, hardware and
    workload fit (1 = the same setting) times the trust its status earns (confirmed > probable >
    hypothesis; refuted counts for nothing). The search and the agent rank entries the same way.
    """
    from orchestrator.knowledge.reuse import weight_legend

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
    if as_json:
        return emit([_entry_dict(e, w) for w, e in hits])
    if hits:
        print(weight_legend())
    for w, e in hits:
        print(_row(e, w))
    if not hits:
        print("(no matching entries)")
    return None


@kb_app.command()
def show(entry_id: str = typer.Argument(..., help="Entry id, as `infergoal kb list` shows it."),
         as_json: bool = typer.Option(False, "--json", help="Print the entry (frontmatter and body) as JSON.")) -> None:
    """One entry in full (frontmatter and body)."""
    kb = _kb()
    e = kb.entries.get(entry_id) or next((p for p in pending(kb.write_dir) if p.id == entry_id), None)
    if e is None:
        fail(f"no entry {entry_id!r}; see `infergoal kb list`")
    if as_json:
        return emit({**e.meta, "body": e.body.strip(), "path": str(e.path)})
    print(e.path.read_text())
    return None


@kb_app.command("lint")
def lint_(as_json: bool = typer.Option(False, "--json", help="Print the problems as a JSON list (empty: OK).")) -> None:
    """Check every entry (seed and workspace); exit 1 on problems."""
    ws = get_workspace()
    problems = lint(ws.kb_read_dirs)
    if as_json:
        emit([str(p) for p in problems])
        if problems:
            raise typer.Exit(1)
        return
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)" if problems else "knowledge base OK")
    if problems:
        raise typer.Exit(1)


@kb_app.command()
def export(out: Path | None = typer.Option(None, "--out", "-o", help="Write JSON here (default: stdout)."),
           as_json: bool = typer.Option(False, "--json", help="Accepted for symmetry: the output is JSON already.")) -> None:
    """Every entry as JSON (id, kind, status, applies_to, the rest of the frontmatter, body)."""
    kb = _kb()
    data = [{**e.meta, "body": e.body.strip(), "path": str(e.path)} for e in sorted(kb.entries.values(), key=lambda e: e.id)]
    text = json.dumps(data, indent=1, default=str) + "\n"
    if out:
        out.write_text(text)
        if as_json:
            return emit({"entries": len(data), "out": str(out)})
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
