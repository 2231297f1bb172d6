"""The host lease: one measuring run per machine (per GPU set), whatever its workspace or user.

Standard library only: the same code takes the lease on this machine (LocalHost) and, through
`hostd lease`, on an SSH host. The lock is an `fcntl.flock` on files in a host-wide folder
(`/tmp/infergoal-leases`, or `$INFERGOAL_LEASE_DIR`), so the kernel releases it the moment its
holder exits, kill -9 included; nothing has to expire.

GPU sets overlap the way the hardware does. A run on all GPUs holds `host.lock` exclusively; a run
on GPUs "0,1" holds `host.lock` shared and `gpu-0.lock`, `gpu-1.lock` exclusively. So runs on
disjoint GPUs pass, and a run on all GPUs waits for every other run (and the other way round).

The file a run holds exclusively carries its identity (workspace, run, user, pid, host, since);
a refused run reads it back to say who holds the host. A clean release empties it; a non-empty
file found by the next holder was left by a holder that died (kill -9, a lost machine): that is
reported as `stale`, and taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_DIR", "Busy", "HostLock", "acquire", "gpu_set", "holders", "lease_dir"]

DEFAULT_DIR = "/tmp/infergoal-leases"
"""Shared by every user of the machine (mode 1777, like /tmp itself)."""


class Busy(Exception):
    """The host (or one of the GPUs asked for) is held; `holders` are the identities holding it."""

    def __init__(self, holders: list[dict[str, Any]]) -> None:
        super().__init__(f"held by {holders}")
        self.holders = holders


def lease_dir(directory: str | Path | None = None) -> Path:
    return Path(directory or os.environ.get("INFERGOAL_LEASE_DIR") or DEFAULT_DIR)


def gpu_set(gpus: str) -> list[str]:
    """`""`/`"all"` -> [] (the whole machine); `"1,0"` -> ["0", "1"]."""
    parts = sorted({g.strip() for g in (gpus or "").split(",") if g.strip()})
    return [] if parts in ([], ["all"]) else parts


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):  # another user's file: it is already 0666
        os.fchmod(fd, 0o666)  # every user's runs must be able to write their identity here
    return fd


def _read(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        return None


def _write(fd: int, identity: dict[str, Any] | None) -> None:
    os.ftruncate(fd, 0)
    if identity is not None:
        os.pwrite(fd, json.dumps(identity).encode(), 0)


def _try(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holders(directory: str | Path | None = None) -> list[dict[str, Any]]:
    """Who holds the host now: the identities in the lock files someone holds exclusively."""
    d = lease_dir(directory)
    found = []
    for path in sorted(d.glob("*.lock")) if d.is_dir() else []:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            # A probe: if a shared lock is refused, someone holds the file exclusively.
            if _try(fd, fcntl.LOCK_SH):
                fcntl.flock(fd, fcntl.LOCK_UN)
                continue
            found.append((_read(fd) or {}) | {"lock": path.stem})
        finally:
            os.close(fd)
    return found


class HostLock:
    """A held host lease. `release()` (or the holder's death) gives it back."""

    def __init__(self, directory: Path, gpus: list[str], identity: dict[str, Any]) -> None:
        self.directory, self.gpus, self.identity = directory, gpus, identity
        self.stale: list[dict[str, Any]] = []
        """Identities left in the files by holders that died without releasing (taken over)."""
        self._fds: list[tuple[int, bool, Path]] = []  # (fd, exclusive, its path)

    def _take(self) -> None:
        wanted = [("host", not self.gpus)] + [(f"gpu-{g}", True) for g in self.gpus]
        for name, exclusive in wanted:
            fd = _open(self.directory / f"{name}.lock")
            if not _try(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH):
                os.close(fd)
                self.release()
                raise Busy(holders(self.directory) or [{"lock": name}])
            self._fds.append((fd, exclusive, self.directory / f"{name}.lock"))
            if exclusive:
                left = _read(fd)
                if left:
                    dead = left.get("holder_host") == socket.gethostname() and not _pid_alive(int(left.get("holder_pid", 0)))
                    self.stale.append(left | {"lock": name, "holder_dead": dead})
                _write(fd, self.identity)

    def update(self, **fields: Any) -> None:
        """Add to the identity (e.g. the run id, known once the run row exists)."""
        self.identity = self.identity | fields
        for fd, exclusive, _ in self._fds:
            if exclusive:
                _write(fd, self.identity)

    def held(self) -> bool:
        """Whether the lease is still this holder's (see `lost_reason`)."""
        return not self.lost_reason()

    def lost_reason(self) -> str:
        """'' while held. A lock file removed (a /tmp cleaner, a person) or replaced leaves our
        flock on a file nobody else opens: the next run creates a new one and takes the host."""
        if not self._fds:
            return "it was released"
        for fd, _, path in self._fds:
            try:
                now, mine = os.stat(path), os.fstat(fd)
            except FileNotFoundError:
                return f"its lock file {path} was removed"
            except OSError as e:
                return f"its lock file {path} cannot be read ({e.strerror})"
            if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                return f"its lock file {path} was replaced"
        return ""

    def take(self) -> None:
        """Take the lease again after losing it; `Busy` names whoever holds it now."""
        self.release()  # our locks sit on files nobody else sees any more
        self.stale = []
        _make_dir(self.directory)  # the whole folder may have gone (a /tmp cleaner)
        self._take()

    def release(self) -> None:
        for fd, exclusive, _ in reversed(self._fds):
            with contextlib.suppress(OSError):
                if exclusive:
                    _write(fd, None)  # an empty file: released cleanly, not stale
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        self._fds = []


def _make_dir(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # only its creator may chmod it; then it is already 1777
        if d.stat().st_uid == os.getuid():
            d.chmod(0o1777)


def acquire(identity: dict[str, Any], gpus: str = "", directory: str | Path | None = None) -> HostLock:
    """Take the host lease for `gpus` ("" = all) without waiting; raise `Busy` naming the holders."""
    d = lease_dir(directory)
    _make_dir(d)
    lock = HostLock(d, gpu_set(gpus), identity | {
        "holder_pid": os.getpid(), "holder_host": socket.gethostname(),
        "gpus": gpus or "all", "since": identity.get("since") or time.time()})
    lock._take()
    return lock
