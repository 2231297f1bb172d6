"""Process groups, ports and logs on this machine, standard library only.

Two users: `LocalHost` in the orchestrator's process, and `orchestrator.remote.hostd` on an SSH
host that may have nothing of infergoal's dependencies but Python. Living here, below both, the
host-side helper does not import `orchestrator.hosts`.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["free_port", "group_exists", "group_pids", "kill_group", "listening_pids", "log_tail"]

_ISSUED: set[int] = set()  # ports free_port handed out in this process


def log_tail(path: str | Path, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def group_pids(pgid: int) -> set[int]:
    """The running processes of group `pgid` (from /proc; zombies, exited but not yet reaped, left out)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            out.add(int(d.name))
    return out


def group_exists(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. `killpg(pgid, 0)` also succeeds for a group
    left with zombies only: on an SSH host a stopped server's parent is the host's init, which may
    reap it seconds later (1.5-2 s on the CPU test machine), and a zombie holds no memory, port or GPU."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not Path("/proc").is_dir() or bool(group_pids(pgid))


def kill_group(pgid: int, grace_s: float, reap: Callable[[], object] | None = None) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not group_exists(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_port() -> int:
    """A free loopback port that this process has not handed out before.

    Binding port 0 and closing the probe socket frees the port again at once, so two servers whose
    ports are picked in a row can be given the same one; the first to bind it then answers at both
    URLs (a CI run of the gate tests measured the 6-bit model's server at the 3-bit model's URL).
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ISSUED:
            _ISSUED.add(port)
            return port


def listening_pids(port: int) -> set[int]:
    """Linux: map LISTEN sockets on `port` (IPv4/IPv6) to the PIDs holding them via /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{inode}]")
    pids = set()
    if not inodes:
        return pids
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    pids.add(int(d.name))
                    break
        except (OSError, PermissionError):
            continue
    return pids
