"""LocalHost against real processes: process groups, health, crashes, timeouts, orphans."""

import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.hosts import HostError, LocalHost, ServerCrashed, ServerTimeout, get_host


def _http_server(port: int) -> list[str]:
    # A parent shell that forks the real listener: stopping must take down the whole group.
    return ["bash", "-c", f"{sys.executable} -m http.server {port} --bind 127.0.0.1 & wait"]


def test_start_health_listening_and_group_stop(tmp_path):
    host = LocalHost(tmp_path / "state")
    port = host.free_port()
    proc = host.start(_http_server(port), env=None, cwd=str(tmp_path), log_path=tmp_path / "log" / "server.log")
    try:
        waited = host.wait_healthy(f"http://127.0.0.1:{port}/", 20, proc)
        assert waited < 20
        group = host.group_pids(proc)
        listeners = host.listening_pids(port)
        assert len(group) >= 2, "bash and its python child share the group"
        assert listeners and listeners <= group, "the listener is a member of the launched group"
        assert (tmp_path / "state" / "servers" / f"{proc.pid}.json").exists()
    finally:
        host.stop(proc, grace_s=5)
    assert not host.alive(proc)
    assert host.listening_pids(port) == set()
    assert not host.group_pids(proc)
    assert not (tmp_path / "state" / "servers" / f"{proc.pid}.json").exists()


def test_crash_before_healthy_reports_log_tail(tmp_path):
    host = LocalHost(tmp_path)
    proc = host.start([sys.executable, "-c", "import sys; print('model load failed: boom'); sys.exit(3)"],
                      env=None, cwd=None, log_path=tmp_path / "crash.log")
    with pytest.raises(ServerCrashed, match="model load failed: boom"):
        host.wait_healthy(f"http://127.0.0.1:{host.free_port()}/health", 20, proc)


def test_hang_times_out_and_stop_kills_a_term_ignoring_server(tmp_path):
    host = LocalHost(tmp_path)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('hanging', flush=True); time.sleep(600)"
    proc = host.start([sys.executable, "-c", code], env=None, cwd=None, log_path=tmp_path / "hang.log")
    with pytest.raises(ServerTimeout, match="not healthy"):
        host.wait_healthy(f"http://127.0.0.1:{host.free_port()}/health", 1.5, proc)
    t0 = time.monotonic()
    host.stop(proc, grace_s=1.0)
    assert not host.alive(proc) and time.monotonic() - t0 < 5


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_orphans_kills_groups_left_by_a_dead_orchestrator(tmp_path):
    host = LocalHost(tmp_path)
    proc = host.start([sys.executable, "-c", "import time; time.sleep(600)"], env=None, cwd=None, log_path=tmp_path / "o.log")
    # The live orchestrator's server is not an orphan: the sweep leaves it alone.
    fresh = LocalHost(tmp_path)
    assert fresh.sweep_orphans() == [] and host.alive(proc)
    # Its orchestrator dies (the pidfile now names a dead owner): a new process sweeps it.
    pidfile = tmp_path / "servers" / f"{proc.pid}.json"
    pidfile.write_text(json.dumps(json.loads(pidfile.read_text()) | {"owner_pid": _dead_pid()}))
    assert fresh.sweep_orphans() == [proc.pgid]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pgid, 0)
        except ProcessLookupError:
            break
        host.alive(proc)  # reap the zombie
        time.sleep(0.1)
    else:
        pytest.fail("orphan group survived the sweep")
    assert fresh.sweep_orphans() == []


def test_missing_binary_is_a_host_error(tmp_path):
    with pytest.raises(HostError, match="could not start"):
        LocalHost(tmp_path).start(["/nonexistent/engine"], env=None, cwd=None, log_path=tmp_path / "x.log")


def test_fingerprint_and_host_keys(tmp_path):
    fp = LocalHost(tmp_path).fingerprint()
    assert fp["host"] == "local" and fp["cpu_count"] >= 1
    assert isinstance(get_host("local", state_dir=tmp_path), LocalHost)
    with pytest.raises(HostError, match="unknown host"):
        get_host("carrier-pigeon://gpu", state_dir=tmp_path)
