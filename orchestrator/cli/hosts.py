"""`infergoal hosts add | list | check | trust | remove | clean`: the workspace's SSH GPU hosts."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from orchestrator.cli.common import console, err, get_workspace
from orchestrator.cli.errors import emit, fail
from orchestrator.hosts.base import HostError

# paramiko (and the gates and bench behind SSHHost) load inside the commands, as in cli/main.py:
# `infergoal --help` and every other command must not pay a second for them.

__all__ = ["hosts_app"]

hosts_app = typer.Typer(help="Remote GPU hosts reached over SSH (stored in the workspace).", no_args_is_help=True)


def _host(name: str) -> Any:
    from orchestrator.hosts.registry import resolve_spec
    from orchestrator.hosts.ssh import SSHHost

    ws = get_workspace()
    try:
        return SSHHost(resolve_spec(name, ws.state_dir), state_dir=ws.state_dir)
    except HostError as e:
        fail(str(e))


@hosts_app.command("add")
def add(
    name: str = typer.Argument(..., help="Short name, used as --host NAME."),
    url: str = typer.Argument(..., help="ssh://user@host:port"),
    key: str = typer.Option("", "--key", help="Private key file (default: the SSH agent and ~/.ssh/id_*)."),
    gpus: str = typer.Option("", "--gpus", help="CUDA_VISIBLE_DEVICES for its servers, e.g. 0,1 (default: all)."),
    python: str = typer.Option("", "--python", help="Python on the host (default: python3)."),
    workdir: str = typer.Option("", "--workdir", help="Work folder on the host (default: ~/.infergoal-host)."),
) -> None:
    """Register a host. Next: `infergoal hosts trust NAME` (a new host key), then `infergoal hosts check NAME`."""
    from orchestrator.hosts.registry import HostRegistry
    from orchestrator.hosts.sshconn import parse_ssh_url

    try:
        spec = parse_ssh_url(url, name=name, key=key, gpus=gpus, python=python, workdir=workdir)
    except HostError as e:
        fail(str(e))
    HostRegistry(get_workspace().state_dir).add(spec)
    console.print(f"added {name} ({spec.known_as}); next: `infergoal hosts trust {name}` if its key is new, "
                  f"then `infergoal hosts check {name}`", highlight=False)


@hosts_app.command("list")
def list_hosts(as_json: bool = typer.Option(False, "--json")) -> None:
    """The registered hosts."""
    from orchestrator.hosts.registry import HostRegistry

    reg = HostRegistry(get_workspace().state_dir)
    rows = [reg.get(n).model_dump() for n in reg.names()]
    if as_json:
        return emit(rows)
    if not rows:
        console.print("no hosts yet; add one with `infergoal hosts add NAME ssh://user@host:port`")
        return
    table = Table("name", "address", "user", "gpus", "python", "key")
    for r in rows:
        table.add_row(r["name"], f"{r['hostname']}:{r['port']}", r["user"], r["gpus"] or "all", r["python"], r["key"])
    console.print(table)


@hosts_app.command("trust")
def trust(name: str = typer.Argument(..., help="Host name or ssh:// URL.")) -> None:
    """Accept the key the host presents now (after checking its fingerprint out of band)."""
    from orchestrator.hosts.registry import resolve_spec
    from orchestrator.hosts.sshconn import trust_host

    ws = get_workspace()
    try:
        spec = resolve_spec(name, ws.state_dir)
        fingerprint, replaced = trust_host(spec, ws.state_dir / "known_hosts")
    except HostError as e:
        fail(str(e))
    note = f" (replaced {replaced})" if replaced else ""
    console.print(f"trusted {spec.known_as}: {fingerprint}{note}", highlight=False)


@hosts_app.command("check")
def check(name: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """Reachability, Python, GPUs and free disk on the host."""
    host = _host(name)
    try:
        fp = host.fingerprint()
    except HostError as e:
        fail(str(e))
    finally:
        host.close()
    problems = []
    if tuple(int(x) for x in fp["python"].split(".")[:2]) < (3, 11):
        problems.append(f"Python {fp['python']} on the host; 3.11+ is needed (pass --python PATH to `hosts add`)")
    if fp.get("disk_free_gb", 100) < 5:
        problems.append(f"only {fp['disk_free_gb']} GB free in the host's work dir")
    fp["problems"] = problems
    if as_json:
        emit(fp)
    else:
        gpus = ", ".join(fp.get("gpus") or []) or "none (CPU only)"
        console.print(f"{name}: reachable; Python {fp['python']}; torch {fp.get('torch', '-')}; GPUs: {gpus}; "
                      f"CUDA {fp.get('cuda', '-')}; disk free {fp.get('disk_free_gb')} GB", highlight=False)
        for p in problems:
            err.print(f"[yellow]warning:[/] {p}", highlight=False)
    if problems:
        raise typer.Exit(1)


@hosts_app.command("remove")
def remove(name: str = typer.Argument(...)) -> None:
    """Forget a host (its known_hosts line stays)."""
    from orchestrator.hosts.registry import HostRegistry

    try:
        HostRegistry(get_workspace().state_dir).remove(name)
    except HostError as e:
        fail(str(e))
    console.print(f"removed {name}")


@hosts_app.command("clean")
def clean(
    name: str = typer.Argument(...),
    everyone: bool = typer.Option(False, "--all", help="Also servers started by other workspaces on that host."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Stop the servers (and standby interpreters) this workspace started on the host (pidfiles there), and only those."""
    host = _host(name)
    try:
        killed = host.sweep_orphans(everyone=everyone)
    except HostError as e:
        fail(str(e))
    finally:
        host.close()
    if as_json:
        return emit({"killed": killed})
    console.print(f"{name}: stopped {len(killed)} server group(s)" + (f": {killed}" if killed else ""))
