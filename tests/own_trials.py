"""The trials a test reads as a run's own: the baseline and the proposer's candidates, in order.

The loop's re-measurements are left out (baseline sentinels, paired A/B rounds): how many there are
depends on the machine. A candidate measured while the host stayed busier than at the baseline is
invalid and re-run against a fresh baseline (a `retry` of the same knobs, `roles.retried`): the re-run
takes its place.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.roles import PAIRED, RETRY, SENTINEL, retried


def candidates(store: Any, run_id: int) -> list[Any]:
    """The run's baseline and candidates in order, each retried one replaced by its re-run."""
    trials = store.list_trials(run_id)
    redone = {first.id: rerun for rerun, first in retried(trials)}
    return [redone.get(t.id, t) for t in trials if t.proposer not in (SENTINEL, PAIRED, RETRY)]
