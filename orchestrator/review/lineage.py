"""`infergoal lineage N`: a candidate's ancestry, back to the baseline.

A trial's parent is the candidate it was built on: the trial a paired A/B round re-measures, a parent
the proposer recorded (an agent editing on top of a kept commit), or else the incumbent — the best
kept trial when it was proposed, which is what its score had to beat. Each step shows the knobs
that changed from its parent and, when the commits differ and the source is a git repository,
the commits in between.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.roles import NOT_SEARCH, REMEASURES

__all__ = ["LineageStep", "lineage", "parent_of"]

_TRAILING_NUMBER = re.compile(r"#(\d+)\s*$")  # "confirm by a clean relaunch: #7" (an old database)
_PAIRED_OF = re.compile(r"of #(\d+)")


@dataclass(frozen=True)
class LineageStep:
    """One ancestor: the trial, what it changed from its parent, and the commits in between."""

    number: int
    status: str
    score: float | None
    commit: str
    knobs: dict[str, Any]
    parent: int | None
    changed: dict[str, Any] = field(default_factory=dict)
    """Knob -> [parent's value, this trial's value], for knobs that differ."""
    commits: list[str] = field(default_factory=list)
    """`sha subject` of the commits between the parent's commit and this one (newest first)."""
    proposer: str = ""
    rationale: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parent_of(trial: Any, trials: list[Any]) -> int | None:
    """The number of the trial `trial` was built on (None for the baseline)."""
    if trial.number == 0:
        return None
    recorded = getattr(trial, "parent_number", None)
    if isinstance(recorded, int):
        return recorded
    if trial.proposer in REMEASURES:  # "paired A/B of #7, round 1: candidate"
        m = _TRAILING_NUMBER.search(trial.rationale or "") or _PAIRED_OF.search(trial.rationale or "")
        if m:
            return int(m.group(1))
    earlier = [t for t in trials if t.number < trial.number and t.status == "kept" and t.score
               and t.proposer not in NOT_SEARCH]
    best = max(earlier, key=lambda t: (t.score, -t.number), default=None)
    return best.number if best is not None else 0


def _commits_between(source: str | None, old: str, new: str) -> list[str]:
    if not source or not old or not new or old == new:
        return []
    try:
        import git

        repo = git.Repo(source, search_parent_directories=True)
        return [f"{c.hexsha[:12]} {c.summary}" for c in repo.iter_commits(f"{old}..{new}", max_count=50)]
    except Exception:  # noqa: BLE001 - the source may be gone or on another machine; lineage still stands
        return [f"{new[:12]} (source repository not available here)"]


def lineage(store: Any, run_id: int, number: int) -> list[LineageStep]:
    """Ancestry of trial `number`, from itself back to the baseline. Raises LookupError."""
    run = store.get_run(run_id)
    trials = store.list_trials(run_id) if run else []
    by_number = {t.number: t for t in trials}
    if number not in by_number:
        raise LookupError(f"run {run_id} has no trial #{number}; list them with `infergoal trials`")
    source = (run.target or {}).get("source") if isinstance(run.target, dict) else None
    steps: list[LineageStep] = []
    seen: set[int] = set()
    cur: int | None = number
    while cur is not None and cur in by_number and cur not in seen:
        seen.add(cur)
        t = by_number[cur]
        p = parent_of(t, trials)
        pt = by_number.get(p) if p is not None else None
        changed = {k: [pt.knobs.get(k) if pt else None, v] for k, v in t.knobs.items() if pt is None or pt.knobs.get(k) != v}
        steps.append(LineageStep(
            number=t.number, status=t.status, score=t.score, commit=t.commit, knobs=dict(t.knobs), parent=p,
            changed=changed if pt is not None else {}, commits=_commits_between(source, pt.commit if pt else "", t.commit),
            proposer=t.proposer, rationale=t.rationale,
        ))
        cur = p
    return steps
