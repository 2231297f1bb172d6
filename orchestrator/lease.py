"""The run lease: which orchestrator process drives a run, and whether it still does.

A run row carries its owner (hostname and pid) and a heartbeat the owner renews every few
seconds from a background thread. A run is *live* while its status is `running`, its heartbeat
is fresh and, when the owner is on this machine, the owner process exists. A `running` run that
is not live was killed (kill -9, a lost machine): `status` shows it as `interrupted` and
`resume` may take it over. `resume` of a live run is refused and names the owner.

By default one live run per engine host: two runs on one machine skew each other's numbers.
`allow_concurrent_runs = true` (config or `-o`) opts a run out, for pools of separate machines.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "HEARTBEAT_S",
    "STALE_S",
    "Lease",
    "LeaseHeld",
    "check_host_free",
    "display_status",
    "is_live",
    "owner_text",
    "pid_alive",
    "refuse_if_live",
    "this_host",
]

HEARTBEAT_S = 5.0
"""How often the owner renews its lease."""
STALE_S = 60.0
"""A lease not renewed for this long is dead (the owner hung, or its machine went away)."""


class LeaseHeld(RuntimeError):
    """Another live process holds the run, or the host; the message names it and what to do."""


def this_host() -> str:
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _age_s(run: Any, now: datetime | None = None) -> float:
    now = now or datetime.now(timezone.utc)
    return (now - run.heartbeat_at).total_seconds() if run.heartbeat_at else float("inf")


def is_live(run: Any, now: datetime | None = None) -> bool:
    """Whether a live process drives `run` (a `RunRecord`)."""
    if run.status != "running" or run.heartbeat_at is None or run.owner_pid is None:
        return False
    if run.owner_host == this_host() and not pid_alive(run.owner_pid):
        return False  # no need to wait for the heartbeat to go stale
    return _age_s(run, now) < STALE_S


def display_status(run: Any) -> str:
    """The status to show: a `running` run nobody drives is `interrupted`."""
    return "interrupted" if run.status == "running" and not is_live(run) else run.status


def owner_text(run: Any) -> str:
    return f"pid {run.owner_pid} on {run.owner_host}, heartbeat {_age_s(run):.0f}s ago"


def _engine_host(host: str, owner_host: str | None) -> str:
    """Where a run's engines run: `local` means the orchestrator's own machine."""
    return f"local@{owner_host}" if host in ("", "local", "localhost") else host


def _refuse_if_busy(host: str, others: list[Any], allow_concurrent: bool) -> None:
    if allow_concurrent:
        return
    mine = _engine_host(host, this_host())
    for o in others:
        if o.status == "running" and is_live(o) and _engine_host(o.host, o.owner_host) == mine:
            raise LeaseHeld(
                f"run {o.id} is live on this host ({owner_text(o)}); two runs on one host skew each other's numbers. "
                "Wait for it (`infergoal status`), or opt in with `-o allow_concurrent_runs=true` for a pool of separate machines"
            )


def refuse_if_live(run: Any) -> None:
    """Raise `LeaseHeld` naming the owner if another live process drives `run`."""
    if is_live(run) and not (run.owner_pid == os.getpid() and run.owner_host == this_host()):
        raise LeaseHeld(
            f"run {run.id} is live ({owner_text(run)}); stop it first (Ctrl-C in its terminal, or "
            f"`kill {run.owner_pid}` on {run.owner_host}) or wait for it — `infergoal status` shows its state"
        )


def check_host_free(store: Any, host: str, allow_concurrent: bool) -> None:
    """Refuse before a run is created if another live run uses `host` (see module doc)."""
    _refuse_if_busy(host, store.list_runs(), allow_concurrent)


class Lease:
    """Hold a run's lease for the duration of a `with` block, renewing it from a thread."""

    def __init__(self, store: Any, run_id: int, *, allow_concurrent: bool = False, interval_s: float = HEARTBEAT_S) -> None:
        self.store, self.run_id, self.allow_concurrent, self.interval_s = store, run_id, allow_concurrent, interval_s
        self.pid = os.getpid()
        self.lost = False
        """Set when another process took the lease over (ours had gone stale)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _check(self, run: Any, others: list[Any]) -> None:
        refuse_if_live(run)
        _refuse_if_busy(run.host, others, self.allow_concurrent)

    def __enter__(self) -> Lease:
        self.store.claim_run(self.run_id, owner_host=this_host(), owner_pid=self.pid, check=self._check)
        self._thread = threading.Thread(target=self._beat, name=f"lease-run-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if not self.store.heartbeat(self.run_id, self.pid):
                    self.lost = True
            except Exception:  # noqa: BLE001 - a busy or briefly unreachable DB: try again next beat
                pass

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        try:
            self.store.release_run(self.run_id, self.pid)
        except Exception:  # noqa: BLE001 - the lease goes stale on its own; never mask the run's outcome
            pass
