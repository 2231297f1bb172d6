"""Hosts: where engines run. One protocol (`base`), two backends picked by a string key: `local`
(this machine) and `ssh` (orchestrator.hosts.ssh, paramiko), and a pool of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.hosts.base import Host, HostError, Proc, ServerCrashed, ServerTimeout
from orchestrator.hosts.gpus import host_gpus
from orchestrator.hosts.local import LocalHost

__all__ = ["Host", "HostError", "LocalHost", "Proc", "ServerCrashed", "ServerTimeout", "get_host", "get_hosts", "host_gpus",
           "on_gpus"]


def get_host(spec: str, *, state_dir: str | Path, model_cache: str = "off", standby: bool = True,
             standby_idle_s: float | None = None, gpus: str = "") -> Host:
    """Pick a host by string key: `local` (default), `ssh://user@host:port`, or a name from `infergoal hosts add`.

    `model_cache`: the workspace's setting for a RAM-backed model copy (orchestrator.remote.modelcache),
    on this machine or, for an SSH host, applied there (`hostd model`). `standby`: the
    workspace's switch for the host's standby interpreter (orchestrator.hosts.standby), and
    `standby_idle_s` how long one waits for a launch before it exits by itself (None: until ended).
    `gpus`: bind the host to this GPU set ("1", "0,1": its servers see only them, its lease holds only them)."""
    if spec in ("", "local", "localhost"):
        return LocalHost(state_dir=state_dir, model_cache=model_cache, standby=standby, standby_idle_s=standby_idle_s,
                         gpus=gpus)
    # Imported on use: the SSH side brings paramiko, and a local run need not pay for it.
    from orchestrator.hosts.registry import HostRegistry
    from orchestrator.hosts.ssh import SSHHost
    from orchestrator.hosts.sshconn import HostSpec, parse_ssh_url

    def bound(s: HostSpec) -> HostSpec:
        return s.model_copy(update={"name": f"{s.name}:gpu{gpus}", "gpus": gpus}) if gpus else s

    if spec.startswith("ssh://"):
        return SSHHost(bound(parse_ssh_url(spec, name=spec)), state_dir=state_dir, model_cache=model_cache,
                       standby=standby, standby_idle_s=standby_idle_s)  # named by its URL in messages
    known = HostRegistry(state_dir)
    if spec in known.names():
        return SSHHost(bound(known.get(spec)), state_dir=state_dir, model_cache=model_cache, standby=standby,
                       standby_idle_s=standby_idle_s)
    raise HostError(f"unknown host {spec!r}; use 'local', ssh://user@host:port, or add it with `infergoal hosts add {spec} ssh://...`")


def get_hosts(spec: str, *, state_dir: str | Path, model_cache: str = "off", standby: bool = True,
              standby_idle_s: float | None = None) -> list[Host]:
    """One host, or a pool written as a comma-separated list (`box0,box1` or `ssh://a,ssh://b`)."""
    parts = [p.strip() for p in spec.split(",")] if "," in spec else [spec]
    if len(set(parts)) != len(parts):
        raise HostError(f"host {spec!r} names the same host twice; register one name per GPU with `hosts add NAME ... --gpus N`")
    return [get_host(p, state_dir=state_dir, model_cache=model_cache, standby=standby, standby_idle_s=standby_idle_s)
            for p in parts]


def on_gpus(spec: str, **kw: Any) -> Callable[[str], Host]:
    """A maker of `spec`'s host bound to a GPU set (`get_host(spec, gpus=...)`), for a GPU pool."""
    return lambda gpus: get_host(spec, gpus=gpus, **kw)
