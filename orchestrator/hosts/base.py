"""The Host protocol, the process it launches, and its errors. Picking a host by name: `orchestrator.hosts`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Host", "HostError", "Proc", "ServerCrashed", "ServerTimeout"]


class HostError(RuntimeError):
    """A host could not do what was asked (unreachable, command failed...)."""


class ServerCrashed(HostError):
    """The launched server exited before it became healthy. Carries its log tail."""


class ServerTimeout(HostError):
    """The launched server did not become healthy in time."""


@dataclass(frozen=True)
class Proc:
    """A launched process group."""

    pid: int
    pgid: int
    argv: tuple[str, ...]
    log_path: str
    standby: bool = False
    """Run by a standby interpreter that had imported the target's `preload` modules beforehand
    (`orchestrator.hosts.standby`); `pid`/`pgid` are that process's."""


class Host(Protocol):
    """Where an engine runs. Implementations: LocalHost (this machine), SSHHost (a box over SSH)."""

    name: str

    def start(self, argv: list[str], *, env: dict[str, str] | None, cwd: str | None, log_path: str | Path,
              preload: Sequence[str] = ()) -> Proc:
        """Launch `argv` as its own process group, stdout+stderr to `log_path`. `preload`: modules a
        Python server imports first; a host may run the launch in an interpreter that imported them
        beforehand where that is equivalent to a cold start (LocalHost's and SSHHost's standby), or ignore it."""
        ...

    def stop(self, proc: Proc, grace_s: float = 10.0) -> None:
        """TERM the group, then KILL it after `grace_s`."""
        ...

    def alive(self, proc: Proc) -> bool: ...

    def quiet(self, *, server: bool = False) -> AbstractContextManager[None]:
        """Around an idle probe of the host, and (`server`) the gates and a measurement of a server of
        ours: pause what the host itself runs beside (the standby interpreter; beside a server
        only where the host has no core to spare); a no-op where there is nothing."""
        ...

    def wait_healthy(self, url: str, timeout_s: float, proc: Proc) -> float:
        """Poll `url` until HTTP 200; return seconds waited. Raise ServerCrashed / ServerTimeout."""
        ...

    def listening_pids(self, port: int) -> set[int]:
        """PIDs holding a listening TCP socket on `port`."""
        ...

    def group_pids(self, proc: Proc) -> set[int]:
        """PIDs currently in the process group of `proc`."""
        ...

    def fingerprint(self) -> dict:
        """Hardware/software facts recorded with each run (CPU, GPU, versions)."""
        ...

    def free_port(self) -> int: ...

    def site(self) -> Any:
        """Where this host's trials are measured: an `orchestrator.hosts.site.Site`."""
    def host_state(self, proc: Proc | None = None, *, gpus: bool = True) -> dict:
        """Load, CPU counters, run queue and (with `gpus`) GPU clocks/temperature/memory now
        (`orchestrator.hosts.state.snapshot`); `proc`'s group is the server under test, whose CPU
        and runnable threads are not counted as other tenants' load."""
        ...
