"""An SSH host's standby interpreter (orchestrator/remote/hostd.py, orchestrator/remote/standbyd.py --fifo)
against a real sshd on loopback: the second launch runs on the standby the first one left on the host,
and serves and logs as a cold one; another environment starts cold and ends it; `close` ends it and
`quiet` pauses it; a standby killed, not reading, or gone by itself after `standby_idle_s` without a launch
(removing its named pipe) makes the next launch start cold without hanging; `hosts clean` ends one whose
orchestrator died, which never held the host's lease."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from standby_server import LOG_LINES, PRELOAD
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.remote import hostlock

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("script")]  # launches servers (conftest.py's) on the host


def _launch(host, ws: Path, name: str, env=None):
    port = host.free_port()
    proc = host.start([sys.executable, str(ws / "srv" / "server.py"), str(port), "serve"], env=env, cwd=str(ws),
                      log_path=ws / "runs" / "1" / name / "server.log", preload=PRELOAD)
    return proc, f"http://127.0.0.1:{port}/health"


def _ready(host, ws: Path, timeout: float = 10.0) -> int:
    """The pid of the standby waiting on the host, once its imports are done (its line in its log)."""
    log = ws / "remote" / "standby" / f"{host.standby_slot}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = host._standby
        if pid is not None and log.exists() and f"standby pid={pid}:" in log.read_text():
            return pid
        time.sleep(0.05)
    pytest.fail("no standby came up on the host")


def _state(pid: int) -> str:
    """The process's state letter (`T` stopped, `Z` zombie...), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _gone(pid: int, timeout: float = 5.0) -> bool:
    """Ended (a zombie the host's init has not reaped yet counts: it holds nothing)."""
    deadline = time.monotonic() + timeout
    while _state(pid) not in ("", "Z", "X"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_second_launch_over_ssh_runs_on_the_standby_and_serves_as_a_cold_one(ws, box):
    cold, url = _launch(box, ws, "cold", env={"X_MODE": "a"})
    assert not cold.standby and box._standby is not None and box._standby != cold.pid
    box.wait_healthy(url, 10, cold)
    pid = _ready(box, ws)
    assert Path(ws / "remote" / "servers" / f"{pid}.json").is_file(), "a pidfile on the host, as a server's"
    assert os.getsid(pid) == pid, "detached: its own session, outliving the hostd call and its channel"
    box.stop(cold, grace_s=2)
    warm, url2 = _launch(box, ws, "warm", env={"X_MODE": "a"})
    try:
        assert warm.standby and warm.pid == warm.pgid == pid
        box.wait_healthy(url2, 10, warm)
        assert urllib.request.urlopen(url2).read() == b"0.125"
        assert box._standby not in (None, pid), "the next standby started with this launch"
    finally:
        box.stop(warm, grace_s=2)
    assert _gone(pid)
    c, w = ((ws / "runs" / "1" / n / "server.log").read_text().splitlines() for n in ("cold", "warm"))
    assert w[0].startswith(f"infergoal: standby pid={pid} runs this launch (preloaded decimal http.server")
    assert re.fullmatch(rf"infergoal: standby pid={pid} took the launch \d+\.\d\ds after it was sent "
                        r"\(its imports took \d+\.\d\ds\)", w[1]), w[1]
    assert w[2:] == c and len(c) == LOG_LINES, "argv, import path, cwd, __name__, environment of a cold start"


def test_another_environment_starts_cold_and_ends_the_standby(ws, box):
    first, url = _launch(box, ws, "a", env={"X_MODE": "a"})
    box.wait_healthy(url, 10, first)
    box.stop(first, grace_s=2)
    pid = _ready(box, ws)
    other, url = _launch(box, ws, "b", env={"X_MODE": "b"})
    try:
        assert not other.standby and other.pid != pid
        assert _gone(pid) and not (ws / "remote" / "servers" / f"{pid}.json").exists()
        box.wait_healthy(url, 10, other)
    finally:
        box.stop(other, grace_s=2)
    # The standby started with it has that environment: the next launch of it runs there.
    nxt = _ready(box, ws)
    third, url = _launch(box, ws, "c", env={"X_MODE": "b"})
    try:
        assert third.standby and third.pid == nxt
        box.wait_healthy(url, 10, third)
    finally:
        box.stop(third, grace_s=2)
    assert "env" in (log := (ws / "runs" / "1" / "c" / "server.log").read_text()) and log.count(" b\n") == 1


def test_quiet_pauses_the_standby_and_close_ends_it(ws, box):
    first, url = _launch(box, ws, "a")
    box.wait_healthy(url, 10, first)
    box.stop(first, grace_s=2)
    pid = _ready(box, ws)
    with box.quiet():  # a probe of the host: paused
        assert _state(pid) == "T"
    assert _state(pid) != "T"
    box._host_cores = 2  # beside a server on a host with no core to spare: paused too
    with box.quiet(server=True):
        assert _state(pid) == "T"
    box._host_cores = 64  # on a larger host it goes on importing (no round trip at all)
    with box.quiet(server=True):
        assert _state(pid) != "T"
    with box.quiet():
        box.close()  # ends a paused standby too
    assert _gone(pid)
    assert not (ws / "remote" / "servers" / f"{pid}.json").exists()
    assert list((ws / "remote" / "standby").glob("*.json")) == [] and list((ws / "remote" / "standby").glob("*.fifo")) == []


@pytest.mark.timeout(30)
def test_a_standby_killed_not_reading_or_idle_makes_the_next_launch_start_cold_without_hanging(ws, box):
    first, url = _launch(box, ws, "a")
    box.wait_healthy(url, 10, first)
    box.stop(first, grace_s=2)
    pid = _ready(box, ws)
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    t0 = time.monotonic()
    second, url = _launch(box, ws, "b")
    assert not second.standby and second.pid != pid and time.monotonic() - t0 < 5
    box.wait_healthy(url, 10, second)
    box.stop(second, grace_s=2)
    # Alive, but no reader on its pipe (here: the pipe replaced by one nobody opened): the host's
    # non-blocking open fails (ENXIO) instead of waiting for a reader forever; the launch starts cold.
    pid = _ready(box, ws)
    rec = json.loads((ws / "remote" / "standby" / f"{box.standby_slot}.json").read_text())
    os.unlink(rec["fifo"])
    os.mkfifo(rec["fifo"])
    t0 = time.monotonic()
    box.standby_idle_s = 0.3  # (for the standby this launch starts)
    third, url = _launch(box, ws, "c")
    assert not third.standby and time.monotonic() - t0 < 8
    assert _gone(pid), "the standby that could not take it is ended"
    box.wait_healthy(url, 10, third)
    box.stop(third, grace_s=2)
    # Idle: no launch came for `standby_idle_s`; it exits by itself (its orchestrator alive or not) and
    # removes its named pipe.
    pid = _ready(box, ws)
    rec = json.loads((ws / "remote" / "standby" / f"{box.standby_slot}.json").read_text())
    assert _gone(pid) and not Path(rec["fifo"]).exists()
    assert f"standby pid={pid}: no launch came in 0.3s; it exits" in Path(rec["log"]).read_text()
    t0 = time.monotonic()
    fourth, url = _launch(box, ws, "d")
    assert not fourth.standby and fourth.pid != pid and time.monotonic() - t0 < 5
    box.wait_healthy(url, 10, fourth)
    box.stop(fourth, grace_s=2)
    assert not (ws / "remote" / "servers" / f"{pid}.json").exists()


ORCHESTRATOR = """
import os, sys
from orchestrator.hosts import get_host
host = get_host("box", state_dir=sys.argv[1])
lease = host.take_lease({"run": "orphan"})
port = host.free_port()
proc = host.start([sys.executable, sys.argv[2], str(port), "serve"], env=None, cwd=None, log_path=sys.argv[3],
                  preload=["decimal"])
print(proc.pgid, host._standby, flush=True)
os.kill(os.getpid(), 9)
"""


def test_hosts_clean_ends_the_standby_of_a_dead_orchestrator(ws, sshd):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", ORCHESTRATOR, str(ws / ".infergoal"), str(ws / "srv" / "server.py"),
                          str(ws / "x" / "y" / "s.log")], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == -9, out.stderr
    server, standby = map(int, out.stdout.split())
    assert _state(standby) not in ("", "Z", "X"), "a detached standby outlives its orchestrator"
    # It holds no part of the host's lease: that went with its orchestrator's channel.
    lease_dir = Path(sshd.dir / "leases")
    deadline = time.monotonic() + 10
    while True:
        try:
            hostlock.acquire({"run": "next"}, "", lease_dir).release()
            break
        except hostlock.Busy:
            assert time.monotonic() < deadline, "the host's lease outlived the orchestrator"
            time.sleep(0.1)
    assert not [fd for fd in Path(f"/proc/{standby}/fd").iterdir() if str(lease_dir) in os.readlink(fd)]
    res = CliRunner().invoke(app, ["-w", str(ws), "hosts", "clean", "box", "--json"])
    assert res.exit_code == 0, res.output
    assert sorted(json.loads(res.output)["killed"]) == sorted([server, standby])
    assert _gone(server) and _gone(standby)
    assert list((ws / "remote" / "standby").glob("*.json")) == [] and list((ws / "remote" / "standby").glob("*.fifo")) == []
