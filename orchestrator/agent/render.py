"""The agent's prompts (jinja2 templates in prompts/) and the compact views of trials they use."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

__all__ = ["history_rows", "render"]

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "prompts"),
    undefined=jinja2.StrictUndefined, autoescape=False, trim_blocks=True, lstrip_blocks=True,
    keep_trailing_newline=True,
)
# Statuses that mean "this direction did not work": the agent should not repeat it blindly.
FAILED = {"failed", "invalid", "discarded", "rejected"}


def render(template: str, **kw: Any) -> str:
    return _ENV.get_template(template).render(**kw)


def history_rows(trials: Sequence[Any], base_knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per trial: number, status, score, changed knobs, commit, a failed-direction mark."""
    rows = []
    for t in trials:
        changed = {k: v for k, v in t.knobs.items() if base_knobs.get(k) != v}
        rows.append({
            "number": t.number, "status": t.status, "score": t.score, "proposer": t.proposer,
            "commit": (t.commit or "")[:10], "changed": changed, "failed": t.status in FAILED,
            "rationale": (t.rationale or "").splitlines()[0][:120] if t.rationale else "",
            "error": (t.error or "")[:200],
            "objective": {k: round(v, 3) for k, v in (t.objective or {}).items()},
        })
    return rows
