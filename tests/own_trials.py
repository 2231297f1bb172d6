"""The trials a test reads as a run's own: the baseline and the proposer's candidates, in order.

The loop's re-measurements are left out (baseline sentinels, paired A/B rounds): how many there are
depends on the machine. A candidate measured while the host stayed busier than at the baseline is
invalid and re-run against a fresh baseline (a `retry` of the same knobs): the re-run takes its place.
"""

from __future__ import annotations

from typing import Any

LOOPS_OWN = ("sentinel", "paired")


def candidates(store: Any, run_id: int) -> list[Any]:
    """The run's baseline and candidates in order, each retried one replaced by its re-run."""
    out: list[Any] = []
    for t in store.list_trials(run_id):
        if t.proposer in LOOPS_OWN:
            continue
        if t.proposer == "retry" and out and out[-1].status == "invalid" and out[-1].knobs == t.knobs:
            out[-1] = t
            continue
        out.append(t)
    return out
