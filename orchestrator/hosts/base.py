"""The Host protocol and its errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Host", "HostError", "Proc", "ServerCrashed", "ServerTimeout", "get_host", "get_hosts"]


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


class Host(Protocol):
    """Where an engine runs. Implementations: LocalHost (this machine)."""

    name: str

    def start(self, argv: list[str], *, env: dict[str, str] | None, cwd: str | None, log_path: str | Path) -> Proc:
        """Launch `argv` as its own process group, stdout+stderr to `log_path`."""
        ...

    def stop(self, proc: Proc, grace_s: float = 10.0) -> None:
        """TERM the group, then KILL it after `grace_s`."""
        ...

    def alive(self, proc: Proc) -> bool: ...

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


def get_host(spec: str, *, state_dir: str | Path) -> Host:
    """Pick a host by string key: `local` (default), `ssh://user@host:port`, or a name from `infergoal hosts add`."""
    # Imported here, not at the top: the SSH side needs paramiko, and `orchestrator.hosts` must
    # stay importable with the standard library alone (the agent shipped to a host imports it).
    from orchestrator.hosts.local import LocalHost

    if spec in ("", "local", "localhost"):
        return LocalHost(state_dir=state_dir)
    from orchestrator.hosts.registry import HostRegistry
    from orchestrator.hosts.ssh import SSHHost
    from orchestrator.hosts.sshconn import parse_ssh_url

    if spec.startswith("ssh://"):
        return SSHHost(parse_ssh_url(spec, name=spec), state_dir=state_dir)  # named by its URL in messages
    known = HostRegistry(state_dir)
    if spec in known.names():
        return SSHHost(known.get(spec), state_dir=state_dir)
    raise HostError(f"unknown host {spec!r}; use 'local', ssh://user@host:port, or add it with `infergoal hosts add {spec} ssh://...`")


def get_hosts(spec: str, *, state_dir: str | Path) -> list[Host]:
    """One host, or a pool written as a comma-separated list (`box0,box1` or `ssh://a,ssh://b`)."""
    parts = [p.strip() for p in spec.split(",")] if "," in spec else [spec]
    if len(set(parts)) != len(parts):
        raise HostError(f"host {spec!r} names the same host twice; register one name per GPU with `hosts add NAME ... --gpus N`")
    return [get_host(p, state_dir=state_dir) for p in parts]
