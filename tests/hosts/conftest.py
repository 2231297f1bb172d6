"""Fixtures of the host tests: the standby tests' server script, and a workspace naming the test sshd as host `box`."""

from pathlib import Path

import pytest
from standby_server import write_server

from orchestrator.hosts import get_host
from orchestrator.hosts.registry import HostRegistry


@pytest.fixture
def script(tmp_path: Path) -> str:
    """The standby tests' server (standby_server.SERVER) at tmp_path/srv/server.py."""
    return str(write_server(tmp_path / "srv"))


@pytest.fixture
def ws(tmp_path, sshd):
    """A workspace whose known_hosts and registry name the test sshd as host `box` (work dir tmp_path/remote)."""
    state = tmp_path / ".infergoal"
    state.mkdir()
    (state / "known_hosts").write_text(sshd.known_hosts_line())
    HostRegistry(state).add(sshd.spec("box", workdir=tmp_path / "remote"))
    return tmp_path


@pytest.fixture
def box(ws):
    """Host `box`; at the end the servers and standbys it left on the host are stopped and it is closed."""
    host = get_host("box", state_dir=ws / ".infergoal")
    yield host
    host.sweep_orphans()
    host.close()
