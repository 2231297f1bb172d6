"""Hosts: where engines run. One protocol: `local`, `ssh` (orchestrator.hosts.ssh, paramiko), and a pool of them."""

from orchestrator.hosts.base import Host, HostError, Proc, ServerCrashed, ServerTimeout, get_host, get_hosts
from orchestrator.hosts.local import LocalHost

__all__ = ["Host", "HostError", "LocalHost", "Proc", "ServerCrashed", "ServerTimeout", "get_host", "get_hosts"]
