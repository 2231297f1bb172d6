"""LocalHost's standby interpreter (orchestrator.hosts.standby) against real processes: a launch it runs
behaves and logs as a cold one, a different environment starts cold, the orphan sweep and `close` end
it, a launch without preload modules never makes one, a server it runs that crashes reads as a crash, and
one that got no launch for `standby_idle_s` exits by itself (never while a job is being written to it)."""

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from standby_server import LOG_LINES, PRELOAD

from orchestrator.hosts import LocalHost, ServerCrashed
from orchestrator.hosts.standby import spawn


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _launch(host: LocalHost, script: str, log: Path, *, env=None, preload=PRELOAD, mode="serve", cwd=None):
    port = host.free_port()
    proc = host.start([sys.executable, script, str(port), mode], env=env, cwd=cwd, log_path=log, preload=preload)
    return proc, f"http://127.0.0.1:{port}/health"


def _standby_ready(host: LocalHost, timeout: float = 20.0) -> int:
    """The waiting standby's pid once it has done its imports (its line in standby.log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sb = host._standby
        log = host.pid_dir / "standby.log"
        if sb is not None and log.exists() and f"standby pid={sb.pid}:" in log.read_text():
            return sb.pid
        time.sleep(0.05)
    pytest.fail("no standby came up")


def _served_once(tmp_path: Path, script: str) -> tuple[LocalHost, int]:
    """A local host that served (and stopped) one launch; the pid of the standby made meanwhile."""
    host = LocalHost(tmp_path)
    proc, url = _launch(host, script, tmp_path / "s.log")
    host.wait_healthy(url, 20, proc)
    host.stop(proc, grace_s=2)
    return host, _standby_ready(host)


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            os.waitpid(pid, os.WNOHANG)  # ours: reap it
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def test_a_launch_through_the_standby_serves_and_logs_as_a_cold_one(tmp_path, script):
    host = LocalHost(tmp_path / "state")
    cold, url = _launch(host, script, tmp_path / "cold.log", env={"X_MODE": "a"}, cwd=str(tmp_path))
    # The next launch's standby starts with this launch, importing beside its start-up.
    assert host._standby is not None and host._standby.pid != cold.pid
    host.wait_healthy(url, 20, cold)
    assert not cold.standby
    pid = _standby_ready(host)
    assert (host.pid_dir / f"{pid}.json").exists(), "a pidfile for the sweep, like a server's"
    with open(f"/proc/{pid}/maps") as f:  # it holds no CUDA context (nor anything of the server's)
        assert "libcuda" not in f.read()
    warm, url2 = _launch(host, script, tmp_path / "warm.log", env={"X_MODE": "a"}, cwd=str(tmp_path))
    host.wait_healthy(url2, 20, warm)
    try:
        assert warm.standby and warm.pid == warm.pgid == pid and os.getpgid(pid) == pid
        import urllib.request

        assert urllib.request.urlopen(url2).read() == urllib.request.urlopen(url).read() == b"0.125"
        c, w = ((tmp_path / n).read_text().splitlines() for n in ("cold.log", "warm.log"))
        assert w[0].startswith(f"infergoal: standby pid={pid} runs this launch (preloaded decimal http.server")
        # Then the standby's own line: how long the launch waited for its imports (done long before here).
        took = re.fullmatch(rf"infergoal: standby pid={pid} took the launch (\d+\.\d\d)s after it was sent "
                            r"\(its imports took (\d+\.\d\d)s\)", w[1])
        assert took and float(took[1]) < 5.0, w[1]
        assert w[2:] == c and len(c) == LOG_LINES  # argv, sys.path[0], cwd, __name__, __file__, env, buffering, ready
        host.stop(warm, grace_s=2)
        assert not host.alive(warm) and _gone(pid)
        assert not (host.pid_dir / f"{pid}.json").exists()
    finally:
        host.stop(cold, grace_s=2)
        host.close()


def test_a_module_launch_through_the_standby_logs_as_a_cold_one_and_a_shadowed_preload_starts_cold(tmp_path, script):
    """`python -m pkg` in the package's folder: argv, import path, __name__ and __file__ as a cold start's; a
    preloaded module's name in that folder (it would win over site-packages cold) keeps launches cold."""
    srv = Path(script).parent
    (srv / "pkg").mkdir()
    Path(script).rename(srv / "pkg" / "__main__.py")
    host = LocalHost(tmp_path / "state")
    logs = []
    try:
        for name in ("cold", "warm"):
            port = host.free_port()
            p = host.start([sys.executable, "-m", "pkg", str(port), "serve"], env={"X_MODE": "m"}, cwd=str(srv),
                           log_path=tmp_path / f"{name}.log", preload=PRELOAD)
            host.wait_healthy(f"http://127.0.0.1:{port}/health", 20, p)
            assert p.standby == (name == "warm")
            host.stop(p, grace_s=2)
            logs.append((tmp_path / f"{name}.log").read_text().splitlines())
            if name == "cold":
                _standby_ready(host)
        c, w = logs
        assert w[2:] == c and len(c) == LOG_LINES
        assert c[0].split()[1:2] == [str(srv / "pkg" / "__main__.py")] and f"path0 {srv} " in c[0]
        (srv / "decimal.py").write_text("")  # `decimal` is preloaded: a cold start would import this file
        port = host.free_port()
        p = host.start([sys.executable, "-m", "pkg", str(port), "serve"], env={"X_MODE": "m"}, cwd=str(srv),
                       log_path=tmp_path / "shadow.log", preload=PRELOAD)
        assert not p.standby
        host.stop(p, grace_s=2)
    finally:
        host.close()


def test_another_environment_starts_cold_and_ends_the_standby(tmp_path, script, monkeypatch):
    host = LocalHost(tmp_path / "state")
    first, url = _launch(host, script, tmp_path / "a.log", env={"X_MODE": "a"})
    host.wait_healthy(url, 20, first)
    host.stop(first, grace_s=2)
    pid = _standby_ready(host)
    # What the orchestrator's own libraries write to its environment later (torch's inductor sets
    # TORCHINDUCTOR_CACHE_DIR when the accuracy gate runs in-process) is not another environment.
    monkeypatch.setenv("INFERGOAL_TEST_SET_LATER", "1")
    same, url = _launch(host, script, tmp_path / "a2.log", env={"X_MODE": "a"})
    assert same.standby and same.pid == pid
    host.wait_healthy(url, 20, same)
    host.stop(same, grace_s=2)
    envs = [[ln for ln in (tmp_path / n).read_text().splitlines() if ln.startswith("env ")] for n in ("a.log", "a2.log")]
    assert envs[0] == envs[1] and len(envs[0]) == 1, "the server saw the environment the host was made with"
    pid = _standby_ready(host)
    second, url = _launch(host, script, tmp_path / "b.log", env={"X_MODE": "b"})
    try:
        assert not second.standby and second.pid != pid
        assert _gone(pid) and not (host.pid_dir / f"{pid}.json").exists()
        host.wait_healthy(url, 20, second)
    finally:
        host.stop(second, grace_s=2)
    # A launch of that environment next gets the standby made for it.
    _standby_ready(host)
    third, url = _launch(host, script, tmp_path / "c.log", env={"X_MODE": "b"})
    try:
        assert third.standby
        host.wait_healthy(url, 20, third)
    finally:
        host.stop(third, grace_s=2)
        host.close()


def test_the_orphan_sweep_ends_a_standby_whose_orchestrator_died(tmp_path, script):
    host, pid = _served_once(tmp_path, script)
    fresh = LocalHost(tmp_path)
    assert fresh.sweep_orphans() == []  # its orchestrator lives: not an orphan
    pidfile = tmp_path / "servers" / f"{pid}.json"
    pidfile.write_text(json.dumps(json.loads(pidfile.read_text()) | {"owner_pid": _dead_pid()}))
    # A real orphan is reaped by init; this one is our child, so reap it while the sweep waits on it.
    sb = host._standby
    threading.Thread(target=lambda: sb.popen.wait(), daemon=True).start()
    assert fresh.sweep_orphans() == [pid]
    assert _gone(pid) and not pidfile.exists()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_close_ends_the_standby_and_a_launch_without_preload_never_makes_one(tmp_path, script):
    host, pid = _served_once(tmp_path, script)
    with host.quiet():  # a measurement: the standby is paused, then goes on
        assert _state(pid) == "T"
    assert _state(pid) != "T"
    with host.quiet():
        host.close()  # ends a paused standby too
    assert _gone(pid) and not (tmp_path / "servers" / f"{pid}.json").exists()
    for preload, argv0 in (((), None), (PRELOAD, "-u")):  # no modules named; an interpreter flag
        port = host.free_port()
        argv = [sys.executable, *([argv0] if argv0 else []), script, str(port), "serve"]
        p = host.start(argv, env=None, cwd=None, log_path=tmp_path / "n.log", preload=preload)
        host.wait_healthy(f"http://127.0.0.1:{port}/health", 20, p)
        host.stop(p, grace_s=2)
        assert not p.standby and host._standby is None
        assert [f.name for f in (tmp_path / "servers").glob("*.json")] == []
    off = LocalHost(tmp_path, standby=False)  # the workspace's switch
    p, url = _launch(off, script, tmp_path / "off.log")
    off.wait_healthy(url, 20, p)
    off.stop(p, grace_s=2)
    assert off._standby is None


def test_beside_a_server_the_standby_is_paused_only_where_no_core_is_spare(tmp_path, script, monkeypatch):
    """An idle probe always pauses the standby (its imports are not another tenant); around gates and a
    bench (`server=True`) it is paused on a host with fewer than QUIET_CORES cores, and left importing on
    a larger one, so the next launch does not wait for imports it could have done meanwhile."""
    from orchestrator.hosts import local

    host, pid = _served_once(tmp_path, script)
    monkeypatch.setattr(local, "_usable_cores", lambda: local.QUIET_CORES)
    with host.quiet(server=True):
        assert _state(pid) != "T"
    with host.quiet():  # a probe
        assert _state(pid) == "T"
    monkeypatch.setattr(local, "_usable_cores", lambda: 2)
    with host.quiet(server=True):
        assert _state(pid) == "T"
    assert _state(pid) != "T"
    host.close()


def test_a_server_that_crashes_in_the_standby_reads_as_a_crash(tmp_path, script):
    host, pid = _served_once(tmp_path, script)
    crash, url = _launch(host, script, tmp_path / "crash.log", mode="crash")
    assert crash.standby and crash.pid == pid
    with pytest.raises(ServerCrashed, match="(?s)infergoal: standby.*engine failed: boom"):
        host.wait_healthy(url, 20, crash)
    # Killed after the hand-over but before its server listens: a crash too, with the log's tail.
    proc, url = _launch(host, script, tmp_path / "s2.log")
    host.wait_healthy(url, 20, proc)
    host.stop(proc, grace_s=2)
    pid = _standby_ready(host)
    os.kill(pid, signal.SIGSTOP)  # hold it before it reads the job, then kill it
    dead, url = _launch(host, script, tmp_path / "dead.log")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ServerCrashed, match="infergoal: standby"):
        host.wait_healthy(url, 20, dead)
    host.stop(dead, grace_s=1)
    host.close()


def test_an_idle_standby_exits_by_itself_and_the_next_launch_starts_cold(tmp_path, script):
    host = LocalHost(tmp_path, standby_idle_s=0.3)
    proc, url = _launch(host, script, tmp_path / "a.log")
    host.wait_healthy(url, 20, proc)
    host.stop(proc, grace_s=2)
    pid = _standby_ready(host)
    assert _gone(pid), "no launch came: it exits by itself"
    assert f"standby pid={pid}: no launch came in 0.3s; it exits" in (host.pid_dir / "standby.log").read_text()
    t0 = time.monotonic()
    cold, url = _launch(host, script, tmp_path / "b.log")
    try:
        assert not cold.standby and cold.pid != pid and time.monotonic() - t0 < 5
        host.wait_healthy(url, 20, cold)
        assert not (host.pid_dir / f"{pid}.json").exists()
    finally:
        host.stop(cold, grace_s=2)
        host.close()


def test_an_idle_standby_takes_the_job_a_host_is_writing_as_its_time_runs_out(tmp_path):
    """The host holds the lock on its end of the pipe while it writes a job; a standby whose idle time runs
    out meanwhile waits for it and takes the job instead of exiting (the job would be lost in the pipe)."""
    (tmp_path / "job.py").write_text("import sys\nprint('ran', sys.argv[1:])\n")
    sb = spawn(sys.executable, ["decimal"], dict(os.environ), str(tmp_path), tmp_path / "sb.log", lambda: None, 0.2)
    deadline = time.monotonic() + 10
    while "imported decimal" not in (tmp_path / "sb.log").read_text():
        assert time.monotonic() < deadline, "the standby never finished its imports"
        time.sleep(0.02)
    fcntl.flock(sb.job_fd, fcntl.LOCK_EX)  # the host, about to write, as the standby's 0.2 s run out
    time.sleep(0.5)
    sb.hand_over([str(tmp_path / "job.py"), "x"], dict(os.environ), str(tmp_path), tmp_path / "job.log")
    assert sb.popen.wait(10) == 0
    assert "ran ['x']" in (tmp_path / "job.log").read_text()
    assert "no launch came" not in (tmp_path / "sb.log").read_text()
