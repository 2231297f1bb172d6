"""The run lease: which orchestrator process drives a run, and whether it still does.

A run row carries its owner (hostname and pid) and a heartbeat the owner renews every few
seconds from a background thread. A run is *live* while its status is `running`, its heartbeat
is fresh and, when the owner is on this machine, the owner process exists. A `running` run that
is not live was killed (kill -9, a lost machine): `status` shows it as `interrupted` and
`resume` may take it over. `resume` of a live run is refused and names the owner.

By default one live run per engine host: two runs on one machine skew each other's numbers.
`allow_concurrent_runs = true` (config, `-o`, or `--share-host`) opts a run out, for pools of
separate machines. Two checks hold the rule: this workspace's runs (the store, above), and
`HostLeases`, a lock the host itself holds (orchestrator/remote/hostlock.py), which every run on
that host takes whatever its workspace, user or machine of origin.
"""

from __future__ import annotations

import getpass
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator.remote.hostlock import Busy

__all__ = [
    "HEARTBEAT_S",
    "LEASE_LOST",
    "LEASE_RETAKEN",
    "SHARE_HINT",
    "STALE_S",
    "HostLeases",
    "Lease",
    "LeaseHeld",
    "busy_message",
    "check_host_free",
    "display_status",
    "is_live",
    "owner_text",
    "pid_alive",
    "refuse_if_live",
    "run_identity",
    "this_host",
]

HEARTBEAT_S = 5.0
"""How often the owner renews its lease."""
STALE_S = 60.0
"""A lease not renewed for this long is dead (the owner hung, or its machine went away)."""


LEASE_LOST = "lease.lost"
"""The run's event when a host lease it held was lost mid-run (its data: host, reason, held_by)."""
LEASE_RETAKEN = "lease.retaken"
"""The run's event when a lost host lease was taken again (its data: host)."""

SHARE_HINT = "wait, or pass --share-host (-o allow_concurrent_runs=true) to measure beside it (numbers will be noisier)"


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
                f"run {o.id} is live on this host ({owner_text(o)}); two runs on one host skew each other's numbers: "
                f"{SHARE_HINT}"
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


# --- the host lease: a lock the engine host holds, whatever the workspace ------------------------
def run_identity(workspace: str | Path, run_id: int | None = None) -> dict[str, Any]:
    """What a host lease says about its holder (see orchestrator/remote/hostlock.py)."""
    return {"workspace": str(Path(workspace).resolve()), "run": run_id, "user": getpass.getuser(),
            "pid": os.getpid(), "host": this_host(), "since": time.time()}


def holder_text(h: dict[str, Any]) -> str:
    who = f"run {h['run']}" if h.get("run") is not None else "a run being started"
    since = ""
    if isinstance(h.get("since"), int | float):
        at = datetime.fromtimestamp(h["since"], timezone.utc)
        since = f" since {at:%Y-%m-%d %H:%M:%S} UTC ({(time.time() - h['since']) / 60:.0f} min ago)"
    return f"{who} of {h.get('workspace', '?')} ({h.get('user', '?')}, pid {h.get('pid', '?')} on {h.get('host', '?')}){since}"


def _host_label(host: Any) -> str:
    return f"this machine ({this_host()})" if getattr(host, "name", "local") == "local" else f"host {host.name}"


def busy_message(host: Any, holders: list[dict[str, Any]]) -> str:
    """One line: who holds the host, since when, and what to do."""
    who = "; ".join(holder_text(h) for h in holders) or "another run (it did not say which)"
    return f"{_host_label(host)} is in use by {who}; {SHARE_HINT}"


class HostLeases:
    """Hold the host lease of every host of a run (a pool: each of them) for a `with` block.

    A host already held refuses the run with `LeaseHeld` (one line naming the holder), or with
    `share` lets it measure beside the holder; either way `notes` says what happened, for the run's
    events. Hosts without a lease (a test fake) are skipped.

    A background thread looks at every lease held each `interval_s`: one lost mid-run (its lock
    file removed or replaced, its SSH channel dropped) is reported as `LEASE_LOST` and taken again
    when it can be (`LEASE_RETAKEN`); while it cannot, its host is named in `lost`. Reports go to
    `on_event(kind, message, data)` (the run's events), or into `notes` while it is unset.
    """

    def __init__(self, hosts: list[Any], identity: dict[str, Any], *, share: bool = False, interval_s: float = HEARTBEAT_S) -> None:
        self.hosts, self.identity, self.share, self.interval_s = hosts, identity, share, interval_s
        self.own_wait_s = 30.0
        """How long a resume waits for a host to free the lease of the run's own dead orchestrator."""
        self.held: list[tuple[Any, Any]] = []
        self.notes: list[tuple[str, str, dict[str, Any]]] = []
        """(event kind, message, data): leases taken over from dead holders, hosts shared on request."""
        self.lost: list[str] = []
        self.on_event: Callable[[str, str, dict[str, Any]], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> HostLeases:
        for host in self.hosts:
            take = getattr(host, "take_lease", None)
            if take is None:
                continue
            try:
                lease = self._take(host, take)
            except Busy as e:
                if not self.share:
                    self.release()
                    raise LeaseHeld(busy_message(host, e.holders)) from None
                who = "; ".join(holder_text(h) for h in e.holders)
                self.notes.append(("lease.shared", f"{_host_label(host)} shared with {who} on request (--share-host): "
                                   "numbers will be noisier", {"host": host.name, "holders": e.holders}))
                continue
            self.held.append((host, lease))
            for s in lease.stale:
                state = "died" if s.get("holder_dead") else "went away"
                self.notes.append(("lease.stale", f"{_host_label(host)}: the lease of {holder_text(s)} was left behind "
                                   f"(its holder {state} without releasing it); taken over", {"host": host.name, "stale": s}))
        if any(hasattr(lease, "take") for _, lease in self.held):  # watch the files and channels
            self._thread = threading.Thread(target=self._watch, name="host-leases", daemon=True)
            self._thread.start()
        return self

    def _own(self, holders: list[dict[str, Any]]) -> bool:
        """Whether the holders are this very run's previous orchestrator (a resume after kill -9)."""
        me = (self.identity.get("workspace"), self.identity.get("run"))
        return me[1] is not None and bool(holders) and all((h.get("workspace"), h.get("run")) == me for h in holders)

    def _take(self, host: Any, take: Any) -> Any:
        """Take one host's lease. Held by this run's own dead orchestrator (the caller has checked
        the run is not live), an SSH host frees it once it sees the old connection gone: wait a
        little for that; a host that never sees it (a partition) is named with the holder to end."""
        deadline = time.monotonic() + self.own_wait_s
        while True:
            try:
                return take(self.identity)
            except Busy as e:
                if not self._own(e.holders):
                    raise
                if time.monotonic() > deadline:
                    pids = ", ".join(str(h.get("holder_pid", "?")) for h in e.holders)
                    raise LeaseHeld(f"{_host_label(host)} is still held for run {self.identity['run']} by its previous "
                                    f"orchestrator ({holder_text(e.holders[0])}), whose connection the host has not "
                                    f"closed; wait a minute and resume again, or end the holder on the host "
                                    f"(`kill {pids}` there)") from None
                time.sleep(0.25)

    def name_run(self, run_id: int) -> None:
        """Write the run id into every lease held (the run row exists only after the lease)."""
        self.identity = self.identity | {"run": run_id}
        for _, lease in self.held:
            lease.update(run=run_id)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()

    def _report(self, kind: str, message: str, data: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, message, data)
                return
            except Exception:  # noqa: BLE001 - a busy store must not end the watch; keep the note instead
                pass
        self.notes.append((kind, message, data))

    def check(self) -> None:
        """One look at every lease held (the watcher's beat): report one lost, take it again."""
        for host, lease in list(self.held):
            if not hasattr(lease, "take") or (host.name not in self.lost and lease.held()):
                continue
            first = host.name not in self.lost
            reason = lease.lost_reason() if first and hasattr(lease, "lost_reason") else ""
            held_by: list[dict[str, Any]] = []
            try:
                lease.take()
            except Busy as e:  # another run has the host now
                held_by = e.holders
            except Exception:  # noqa: BLE001 - still unreachable: try again next beat
                pass
            taken = lease.held()
            if first:
                who = "; ".join(holder_text(h) for h in held_by)
                self._report(LEASE_LOST, f"{_host_label(host)}: host lease lost mid-run ({reason or 'no longer held'})"
                             + (f"; the host is now held by {who}" if who else "")
                             + ("" if taken else "; measurements until it is taken again may share the host"),
                             {"host": host.name, "reason": reason, "held_by": held_by})
            if taken:
                self._report(LEASE_RETAKEN, f"{_host_label(host)}: host lease taken again", {"host": host.name})
                if host.name in self.lost:
                    self.lost.remove(host.name)
            elif first:
                self.lost.append(host.name)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
            self._thread = None
        for _, lease in reversed(self.held):
            try:
                lease.release()
            except Exception:  # noqa: BLE001 - an unreachable host frees it itself when the channel dies
                pass
        self.held = []

    def __exit__(self, *exc: object) -> None:
        self.release()
