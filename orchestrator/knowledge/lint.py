"""Check a knowledge base: every entry parses and carries what readers rely on."""

from __future__ import annotations

from pathlib import Path

from orchestrator.knowledge.entries import KINDS, STATUS_RANK, parse_entry

__all__ = ["lint"]

_REQUIRED = ("id", "kind", "title", "status", "created", "updated")


def lint(dirs: list[Path]) -> list[str]:
    """Problems as `path: what is wrong; what to do` lines (empty = clean)."""
    problems: list[str] = []
    seen: dict[str, Path] = {}
    for d in dirs:
        for f in sorted(Path(d).rglob("*.md")) if Path(d).is_dir() else []:
            if f.name.lower() == "readme.md":
                continue
            try:
                e = parse_entry(f)
            except ValueError as err:
                problems.append(str(err))
                continue
            pending = "pending" in f.relative_to(d).parts
            missing = [k for k in _REQUIRED if k not in e.meta]
            if missing:
                problems.append(f"{f}: missing {', '.join(missing)}; add them to the frontmatter")
            if e.kind not in KINDS:
                problems.append(f"{f}: kind {e.kind!r} is not one of {', '.join(KINDS)}")
            if e.status not in STATUS_RANK and not (pending and e.status == "pending"):
                problems.append(f"{f}: status {e.status!r} is not one of {', '.join(STATUS_RANK)}")
            if e.kind == "finding" and not e.meta.get("evidence"):
                problems.append(f"{f}: a finding needs evidence (run and trial ids, or a public source with numbers)")
            if e.kind == "contract" and e.status != "confirmed" and not pending:
                problems.append(f"{f}: a contract outside pending/ must be confirmed (approved by a person)")
            if not isinstance(e.meta.get("applies_to", {}), dict):
                problems.append(f"{f}: applies_to must be a mapping (engine, model, hardware, workload)")
            if e.id in seen and seen[e.id].parent == f.parent:
                problems.append(f"{f}: id {e.id!r} is also used by {seen[e.id]}")
            seen[e.id] = f
    return problems
