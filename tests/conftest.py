"""Shared fixtures: the forge's tiny model, built once and cached (see orchestrator.models)."""

import pytest


@pytest.fixture(autouse=True)
def _lease_dir(tmp_path_factory, monkeypatch):
    """Each test its own host-lease folder (orchestrator/remote/hostlock.py): tests running side by
    side on one machine must not refuse each other's runs. Runs within one test share it."""
    monkeypatch.setenv("INFERGOAL_LEASE_DIR", str(tmp_path_factory.mktemp("leases")))


@pytest.fixture(scope="session")
def tiny_model():
    from orchestrator.models import forge

    return forge.default_model()



@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A real sshd on a loopback port (skipped where OpenSSH's server is not installed)."""
    from sshd_server import SSHD, Sshd

    if SSHD is None:
        pytest.skip("OpenSSH server not installed (apt-get install -y openssh-server; .ci/run does it)")
    server = Sshd.start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()
