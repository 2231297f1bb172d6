"""Hosts: where engines run. One protocol; `local` now, `ssh` (paramiko) beside it later."""

from orchestrator.hosts.base import Host, HostError, Proc, ServerCrashed, ServerTimeout, get_host
from orchestrator.hosts.local import LocalHost

__all__ = ["Host", "HostError", "LocalHost", "Proc", "ServerCrashed", "ServerTimeout", "get_host"]
