"""Human actions on a run, each one an event with who and when: the audit log.

The loop's own events (trial finished, resume, stop) are history; these are decisions a person
took, and `infergoal log` lists them: relocking the gates, approving or rejecting a trial that
drifted, steering the proposer, stopping a run, approving a contract change.
"""

from __future__ import annotations

import getpass
from typing import Any

__all__ = ["HUMAN_ACTIONS", "DecisionError", "decide", "human_actions", "record_action", "who_am_i"]

#: Event kinds written for a person's act (the knowledge base's contract approvals included).
HUMAN_ACTIONS: tuple[str, ...] = (
    "gates.relock", "approve", "reject", "steer", "stop.request", "contract.approve", "contract.reject",
)


class DecisionError(ValueError):
    """An approve/reject on a trial that is not waiting for one."""


def who_am_i() -> str:
    """The OS user: who a command-line action is recorded as, unless told otherwise."""
    return getpass.getuser()


def record_action(store: Any, run_id: int | None, kind: str, message: str, *, who: str,
                  trial_id: int | None = None, **data: Any) -> Any:
    """Append a human action to the audit log (`who` always in its data)."""
    return store.add_event(run_id, kind, message, trial_id=trial_id, data={"who": who, **data})


def decide(store: Any, run_id: int, number: int, status: str, who: str) -> Any:
    """Approve (`kept`) or reject (`rejected`) a `needs_approval` trial; recorded with who and when.

    `infergoal approve/reject` and the shell call this: an approved trial becomes the run's best when it
    scores higher than the current best.
    """
    t = store.get_trial_by_number(run_id, number)
    if t is None or t.status != "needs_approval":
        raise DecisionError(
            f"trial #{number} of run {run_id} is not waiting for approval (status: {t.status if t else 'missing'})"
        )
    store.set_trial_status(t.id, status)
    kind = "approve" if status == "kept" else "reject"
    record_action(store, run_id, kind, f"trial #{number} {status} by {who}", who=who, trial_id=t.id)
    if status == "kept":
        run = store.get_run(run_id)
        best = store.get_trial(run.best_trial_id) if run.best_trial_id else None
        if best is None or (t.score or 0) > (best.score or 0):
            store.set_best_trial(run_id, t.id)
    return store.get_trial(t.id)


def human_actions(store: Any, run_id: int | None = None) -> list[dict[str, Any]]:
    """Every human action (of one run, plus the run-less ones like relocks), oldest first."""
    out = []
    for e in store.events():
        if e.kind not in HUMAN_ACTIONS:
            continue
        if run_id is not None and e.run_id not in (run_id, None):
            continue
        data = e.data if isinstance(e.data, dict) else {}
        out.append({"ts": e.ts, "run": e.run_id, "trial_id": e.trial_id, "kind": e.kind,
                    "who": data.get("who", "?"), "message": e.message})
    return out
