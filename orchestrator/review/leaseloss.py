"""Host leases a run lost mid-run, as the run recorded them, for `status`, `why` and the shell.

The watcher of the leases (`orchestrator.hosts.runlease.HostLeases`) writes `lease.lost` when a lease it
held is gone (its lock file removed or replaced, its SSH channel dropped) and `lease.retaken`
when it has the host again; this module reads those events back, never re-deriving them.
"""

from __future__ import annotations

from typing import Any

from orchestrator.hosts.runlease import LEASE_LOST, LEASE_RETAKEN

__all__ = ["lease_losses", "lease_words"]


def lease_losses(events: list[Any]) -> list[dict[str, Any]]:
    """Each loss: host, when (`at`), why, who held the host then, and when it was taken again
    (`retaken_at`; None: never, so the measurements after `at` may have shared the host)."""
    out: list[dict[str, Any]] = []
    for e in sorted(events, key=lambda e: e.id):  # a retake answers the loss before it
        d = e.data if isinstance(e.data, dict) else {}
        if e.kind == LEASE_LOST:
            out.append({"host": d.get("host"), "at": e.ts, "reason": d.get("reason") or "",
                        "held_by": d.get("held_by") or [], "retaken_at": None})
        elif e.kind == LEASE_RETAKEN:
            open_ = [x for x in out if x["host"] == d.get("host") and x["retaken_at"] is None]
            if open_:
                open_[-1]["retaken_at"] = e.ts
    return out


def lease_words(loss: dict[str, Any]) -> str:
    """One loss as a sentence: `host lease of local lost at 03:12:04 UTC (...); taken again at ...`."""
    said = f"host lease of {loss['host']} lost at {loss['at']:%H:%M:%S} UTC"
    said += f" ({loss['reason']})" if loss["reason"] else ""
    if loss["retaken_at"] is not None:
        return said + f"; taken again at {loss['retaken_at']:%H:%M:%S} UTC"
    return said + "; not taken again: measurements after it may have shared the host"
