"""Trial roles and the exceptions that stop a run: the loop's vocabulary, owned here and nowhere else.

A trial's `proposer` column holds either the name of the proposer that suggested it (`search`,
`scripted`, `claude`, `hybrid`...) or one of the roles below, for the trials the loop adds itself.
Every reader (the controller, `infergoal why`, the report, the knowledge base) asks these sets,
so a role added here is counted the same way everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = [
    "BASELINE", "BASELINES", "LOOP_ADDED", "MEASUREMENTS", "NEVER_KEPT", "NOT_SEARCH", "PAIRED", "PROBE",
    "REMEASURES", "RETIRED", "RETRY", "SENTINEL", "BudgetExhausted", "GoalMet", "ProposerExhausted", "Refused", "Stalled",
    "StopRun", "retried", "search_history",
]

BASELINE = "baseline"
"""Trial #0: the target's default knobs; every candidate is judged against a baseline."""
SENTINEL = "sentinel"
"""The baseline re-measured every few trials and whenever the host's state moved."""
PAIRED = "paired"
"""One half of a paired A/B confirmation round (also the kind of the event that records its outcome)."""
RETRY = "retry"
"""A search trial re-run against a fresh baseline because the host stayed busier than at the old one."""
PROBE = "probe"
"""After the stop: one of the winner's one-knob neighbours, measured for the knowledge base."""

# Written only by versions from before paired confirmation ("confirm by a clean relaunch: #7");
# databases of that time still hold it, so it stays in the sets below and nowhere else.
_LEGACY_CONFIRM = "confirm"

RETIRED = (_LEGACY_CONFIRM,)
"""Roles no version writes any more; a reader that counts observations skips them."""
BASELINES = (BASELINE, SENTINEL)
"""Trials that measure the baseline: judged against nothing, later candidates are judged against them."""
MEASUREMENTS = (_LEGACY_CONFIRM, PAIRED, SENTINEL)
"""Trials that re-measure the baseline or a candidate: they judge others, not themselves."""
REMEASURES = (_LEGACY_CONFIRM, PAIRED)
"""Trials that re-measure one candidate; their rationale names it (`paired A/B of #7, round 1: candidate`)."""
NEVER_KEPT = (_LEGACY_CONFIRM, PROBE)
"""Trials measured and judged like a candidate but always discarded (evidence, not answers)."""
NOT_SEARCH = (_LEGACY_CONFIRM, PAIRED, SENTINEL, PROBE)
"""Trials the loop adds itself that are never the best."""
LOOP_ADDED = (*NOT_SEARCH, RETRY)
"""Trials the loop adds itself: not counted in the trial budget, not shown to the proposer (a retry may set the best)."""


def retried(trials: Sequence[Any]) -> list[tuple[Any, Any]]:
    """(retry, the search trial it re-ran) pairs, in order: the trial re-run is the latest earlier one the loop did
    not add, with the same knobs, left invalid (the re-run follows it, after the baseline's sentinel)."""
    out: list[tuple[Any, Any]] = []
    last: Any = None
    for t in trials:
        if t.proposer == RETRY:
            if last is not None and last.status == "invalid" and last.knobs == t.knobs:
                out.append((t, last))
        elif t.proposer not in LOOP_ADDED:
            last = t
    return out


def search_history(trials: Sequence[Any]) -> list[Any]:
    """The trials a proposer is shown: its own and the baseline, in order, not the loop's. A trial re-run on a busy
    host reads as its re-run measured it (status, score, objective, error, timings), under its own number."""
    redone = {first.id: rerun for rerun, first in retried(trials)}
    shown = []
    for t in trials:
        if t.proposer in LOOP_ADDED:
            continue
        r = redone.get(t.id)
        shown.append(t if r is None else dataclasses.replace(
            t, status=r.status, score=r.score, objective=r.objective, error=r.error, timings=r.timings))
    return shown


class StopRun(Exception):
    """The run ends; the message is the stop reason."""


class GoalMet(StopRun):
    pass


class BudgetExhausted(StopRun):
    pass


class Stalled(StopRun):
    pass


class ProposerExhausted(StopRun):
    pass


class Refused(StopRun):
    """The run cannot give a trustworthy answer as configured (e.g. a bench scale too small)."""
