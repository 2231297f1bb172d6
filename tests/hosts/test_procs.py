"""Process groups on a host (orchestrator/remote/procs.py): an exited server nobody has reaped yet is gone."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.remote.procs import free_port, group_exists, group_pids, kill_group


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_group_of_zombies_is_gone_and_a_stop_does_not_wait_for_its_reaper():
    # On an SSH host a server's parent is the host's init once hostd exits, and it reaps when it
    # does: the group then holds only a zombie, which killpg(pgid, 0) still finds.
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while _state(dead.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(dead.pid) == "Z"  # exited, not reaped (no wait() yet)
        assert group_exists(live.pid) and not group_exists(dead.pid)
        assert group_pids(live.pid) == {live.pid} and group_pids(dead.pid) == set()
        t0 = time.monotonic()
        kill_group(dead.pid, grace_s=5.0)
        assert time.monotonic() - t0 < 1.0
    finally:
        live.kill()
        live.wait()
        dead.wait()


def test_free_port_never_hands_out_a_port_twice():
    # Bind-0 alone returns a port it gave before once the probe is closed: in 2,000 draws from
    # Linux's ~28,000 ephemeral ports a repeat is all but certain (a CI run started two gate
    # servers on one port). free_port's ports are all distinct, and each is free to bind.
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_the_gate_fleet_refuses_a_url_answered_by_another_process(tmp_path):
    import gate_servers

    port = free_port()
    answering = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                  "--directory", str(tmp_path)], start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    (tmp_path / "health").write_text("ok")  # http.server answers /health with 200
    log = tmp_path / "ours.log"
    log.write_text("")
    try:
        with pytest.raises(RuntimeError, match=f"not by the server started for it \\(pid {ours.pid}\\)"):
            gate_servers.wait_healthy(f"http://127.0.0.1:{port}", ours, log, timeout=20)
        gate_servers.wait_healthy(f"http://127.0.0.1:{port}", answering, log, timeout=20)  # its own: accepted
    finally:
        for p in (answering, ours):
            p.kill()
            p.wait()
