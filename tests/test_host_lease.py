"""One measuring run per host (per GPU set), whatever the workspace or user.

The lease is a lock the host holds (orchestrator/remote/hostlock.py): two workspaces on one
machine, the second refused with one line naming the first, then let in once the first ends or is
killed -9 (a real process holding the lock); the same through an SSH host (a real sshd on
loopback, where `hostd lease` holds the lock on the host for as long as its channel is open).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config.goal import parse_goal
from orchestrator.core.exitcodes import EXIT_CODES
from orchestrator.hosts import LocalHost
from orchestrator.hosts.registry import HostRegistry
from orchestrator.hosts.runlease import LEASE_LOST, LEASE_RETAKEN, HostLeases, LeaseHeld, run_identity
from orchestrator.hosts.ssh import SSHHost
from orchestrator.remote import hostlock
from orchestrator.runs import _note_leases
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[1]

# A second process holding the lease as a run would: `HostLeases` on the hosts of workspace argv[1]
# (`local`, or an SSH host registered there), with run id argv[2], until its stdin closes.
HOLDER = """
import sys
from pathlib import Path
from orchestrator.hosts import get_hosts
from orchestrator.hosts.runlease import HostLeases, run_identity
ws, run, host = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
hosts = get_hosts(host, state_dir=ws / ".infergoal")
with HostLeases(hosts, run_identity(ws, run)) as leases:
    print("held", flush=True)
    sys.stdin.read()
"""


def _holder(ws: Path, run: int, host: str = "local") -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(ws), str(run), host], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "held"
    return p


def _workspace(path: Path) -> Path:
    (path / ".infergoal").mkdir(parents=True)
    return path


def _take(ws: Path, host: str = "local", run: int = 99, **kw) -> HostLeases:
    from orchestrator.hosts import get_hosts

    return HostLeases(get_hosts(host, state_dir=ws / ".infergoal"), run_identity(ws, run), **kw)


def _until_free(ws: Path, host: str = "local", timeout_s: float = 15.0) -> HostLeases:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _take(ws, host).__enter__()
        except LeaseHeld:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_second_workspace_refused_then_let_in_after_the_first_ends_or_is_killed(tmp_path):
    a, b = _workspace(tmp_path / "a"), _workspace(tmp_path / "b")
    first = _holder(a, 7)
    try:
        with pytest.raises(LeaseHeld) as e, _take(b):
            pass
        msg = str(e.value)
        assert "\n" not in msg and f"run 7 of {a.resolve()}" in msg and f"pid {first.pid}" in msg
        assert "since " in msg and "--share-host" in msg and "noisier" in msg
        with _take(b, share=True) as shared:  # opted in: measures beside it, and says so
            assert shared.held == [] and shared.notes[0][0] == "lease.shared"
    finally:
        first.stdin.close()  # the first run ends
        first.wait(10)
    with _take(b) as leases:
        assert len(leases.held) == 1 and leases.notes == [], "a clean release leaves nothing stale"

    second = _holder(a, 8)
    second.send_signal(signal.SIGKILL)
    second.wait(10)
    leases = _until_free(b)
    try:
        (kind, message, data), = leases.notes
        assert kind == "lease.stale" and "run 8" in message and "died" in message and data["stale"]["holder_dead"]
    finally:
        leases.release()


def test_gpu_sets_overlap_like_the_hardware(tmp_path):
    ident = {"workspace": str(tmp_path), "run": 1}
    g0 = hostlock.acquire(ident, "0")
    try:
        hostlock.acquire(ident | {"run": 2}, "1").release()  # disjoint GPUs pass
        for gpus in ("0,1", "", "all"):  # overlapping ones (all GPUs among them) wait
            with pytest.raises(hostlock.Busy) as e:
                hostlock.acquire(ident | {"run": 3}, gpus)
            assert [h["run"] for h in e.value.holders] == [1]
    finally:
        g0.release()
    everything = hostlock.acquire(ident | {"run": 4}, "")
    try:
        with pytest.raises(hostlock.Busy) as e:
            hostlock.acquire(ident, "3")
        assert [h["run"] for h in e.value.holders] == [4]
    finally:
        everything.release()


def test_goal_refused_with_one_error_line_naming_the_holder(tmp_path):
    """The CLI, as a real subprocess: exit code `busy`, one `error:` line, and no run row left."""
    a, b = _workspace(tmp_path / "a"), _workspace(tmp_path / "b")
    first = _holder(a, 3)
    try:
        r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "-w", str(b), "goal",
                            "beat the baseline by 20% on TPOT within 3 trials", "--no-report"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        first.stdin.close()
        first.wait(10)
    assert r.returncode == EXIT_CODES["busy"], r.stderr
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: this machine") and f"run 3 of {a.resolve()}" in errors[0], r.stderr
    db = b / ".infergoal" / "infergoal.db"
    assert not db.exists() or Store(f"sqlite:///{db}").list_runs() == []


def test_resume_takes_the_share_host_flag(tmp_path):
    r = CliRunner().invoke(app, ["resume", "--help"])
    assert "--share-host" in r.output
    r = CliRunner().invoke(app, ["goal", "--help"])
    assert "--share-host" in r.output


# --- through an SSH host ---------------------------------------------------------------------
@pytest.fixture
def two_ws(tmp_path, sshd):
    """Two workspaces (separate work dirs on the host) that both register the test sshd as `box`."""
    out = []
    for name in ("a", "b"):
        ws = _workspace(tmp_path / name)
        (ws / ".infergoal" / "known_hosts").write_text(sshd.known_hosts_line())
        HostRegistry(ws / ".infergoal").add(sshd.spec("box", workdir=tmp_path / f"remote-{name}"))
        out.append(ws)
    return out


def test_ssh_host_second_workspace_refused_then_let_in(two_ws, sshd):
    a, b = two_ws
    with _take(a, "box", run=5) as first:
        lease = first.held[0][1]
        assert lease.held()
        with pytest.raises(LeaseHeld) as e, _take(b, "box"):
            pass
        assert "host box is in use by run 5 of" in str(e.value) and str(a.resolve()) in str(e.value)
        first.name_run(6)  # the run id written once the row exists reaches the host
        deadline = time.monotonic() + 10
        while [h.get("run") for h in hostlock.holders(sshd.dir / "leases")] != [6] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [h.get("run") for h in hostlock.holders(sshd.dir / "leases")] == [6]
        # The lease is the host's, not the workspace's: a local run on that machine waits too.
        with pytest.raises(hostlock.Busy):
            hostlock.acquire(run_identity(b), "", sshd.dir / "leases")
    with _take(b, "box") as second:  # the first ended: its holder on the host exited
        assert len(second.held) == 1 and second.notes == []
        for _, lease in second.held:
            assert isinstance(lease.host, SSHHost)


def test_ssh_host_lease_freed_when_its_orchestrator_is_killed(two_ws):
    a, b = two_ws
    first = _holder(a, 9, "box")
    with pytest.raises(LeaseHeld, match="run 9"), _take(b, "box"):
        pass
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # Its resume, at once: the host frees the dead orchestrator's lease when sshd ends the session
    # (`hostd lease` reads end of input); the resume waits for that instead of refusing itself.
    with _take(a, "box", run=9) as resumed:
        assert len(resumed.held) == 1
    leases = _until_free(b, "box")
    leases.release()


def test_a_resume_names_its_own_orphaned_holder_it_cannot_wait_out(tmp_path):
    """A holder of this very run that stays (a partition: the host never saw the connection go)."""
    a = _workspace(tmp_path / "a")
    first = _holder(a, 4)
    try:
        leases = _take(a, run=4)
        leases.own_wait_s = 0.3
        with pytest.raises(LeaseHeld, match=f"still held for run 4 by its previous orchestrator .*`kill {first.pid}` there"):
            leases.__enter__()
        with pytest.raises(LeaseHeld, match="is in use by run 4"), _take(a, run=5):  # another run: refused at once
            pass
    finally:
        first.stdin.close()
        first.wait(10)


def test_local_host_lease_uses_the_visible_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    host = LocalHost(state_dir=tmp_path / ".infergoal")
    lock = host.take_lease({"run": 1})
    try:
        assert lock.gpus == ["2"] and hostlock.acquire({"run": 2}, "3").release() is None
    finally:
        lock.release()


def test_ssh_lease_taken_again_after_the_connection_drops(two_ws, sshd):
    a, b = two_ws
    with _take(a, "box", run=11, interval_s=0.2) as leases:
        told = []
        leases.on_event = lambda kind, message, data: told.append((kind, message))
        lease = leases.held[0][1]
        assert sshd.drop_connections() >= 1
        deadline = time.monotonic() + 20
        while not (lease.held() and [h.get("run") for h in hostlock.holders(sshd.dir / "leases")] == [11]):
            assert time.monotonic() < deadline, "the lease was not taken again after the connection came back"
            time.sleep(0.2)
        assert leases.lost == []
        with pytest.raises(LeaseHeld, match="run 11"), _take(b, "box"):
            pass
    # The drop is in the run's events, not only healed: measurements around it may have shared the host.
    assert [k for k, _ in told] == [LEASE_LOST, LEASE_RETAKEN], told
    assert "host box: host lease lost mid-run (the SSH channel of `hostd lease` on box closed" in told[0][1]



def test_ssh_lease_whose_lock_file_is_removed_on_the_host_is_lost_then_taken_again(two_ws, sshd):
    """`hostd lease` looks at its lock files every 2 s: one removed on the host ends it with the
    reason, which the run's events carry (lease.lost), and the lease is taken again. ~5 s."""
    a, _ = two_ws
    with _take(a, "box", run=12, interval_s=0.2) as leases:
        told = []
        leases.on_event = lambda kind, message, data: told.append((kind, message))
        (sshd.dir / "leases" / "host.lock").unlink()
        deadline = time.monotonic() + 30
        while [k for k, _ in told] != [LEASE_LOST, LEASE_RETAKEN]:
            assert time.monotonic() < deadline, told
            time.sleep(0.1)
        assert f"on box, its lock file {sshd.dir / 'leases' / 'host.lock'} was removed" in told[0][1], told
        assert [h.get("run") for h in hostlock.holders(sshd.dir / "leases")] == [12]


# --- a lease lost mid-run ----------------------------------------------------------------------
def _run_row(ws: Path) -> tuple[Store, int]:
    store = Store(f"sqlite:///{ws / '.infergoal' / 'infergoal.db'}")
    g = parse_goal("beat the baseline by 20% on TPOT within 3 trials")
    run = store.create_run("r", g.text, g.model_dump(mode="json"), g.digest, {"name": "t"}, {}, "local", "search")
    return store, run.id


def _kinds(store: Store, rid: int) -> list[str]:
    return [e.kind for e in store.events(rid) if e.kind.startswith("lease.")]


def test_a_local_lease_lost_mid_run_is_in_the_events_status_and_why(tmp_path):
    """The lock file removed under a run: written to its events as it happens (by the watcher
    thread), taken again when nobody took the host meanwhile; when another run did, the loss
    stays, names it, and `status`, `why` and their --json say so."""
    ws = _workspace(tmp_path / "a")
    store, rid = _run_row(ws)
    lock_file = hostlock.lease_dir() / "host.lock"
    before = store.create_trial(rid, 0, commit="", knobs={}, rationale="baseline", proposer="baseline")
    store.start_trial(before.id, "serve", None)
    store.finish_trial(before.id, "kept", score=1.0, objective={}, timings={"total": 1.0})
    with _take(ws, run=rid, interval_s=0.05) as leases:
        _note_leases(store, rid, leases)  # the wiring start_run and resume_run use
        lock = leases.held[0][1]
        assert lock.held() and _kinds(store, rid) == []
        lock_file.unlink()  # a /tmp cleaner, or a person
        deadline = time.monotonic() + 10
        while _kinds(store, rid) != [LEASE_LOST, LEASE_RETAKEN]:
            assert time.monotonic() < deadline, _kinds(store, rid)
            time.sleep(0.05)
        assert lock.held() and lock_file.is_file() and leases.lost == []
    during = store.create_trial(rid, 1, commit="", knobs={}, rationale="p", proposer="search")
    store.start_trial(during.id, "serve", None)
    with _take(ws, run=rid, interval_s=3600) as leases:  # this test beats the watcher itself from here
        _note_leases(store, rid, leases)
        lock = leases.held[0][1]
        lock_file.unlink()
        other = hostlock.acquire(run_identity(tmp_path / "b", 8))  # another run takes the host in the gap
        assert not lock.held() and "was replaced" in lock.lost_reason()  # removed, and made anew by the other run
        leases.check()
        leases.check()  # still taken: said once, not every beat
        assert _kinds(store, rid) == [LEASE_LOST, LEASE_RETAKEN, LEASE_LOST] and leases.lost == ["local"]
        lost = store.events(rid, kind=LEASE_LOST)[-1]
        assert [h["run"] for h in lost.data["held_by"]] == [8] and "now held by run 8" in lost.message
        with pytest.raises(LeaseHeld, match="run 8"), _take(tmp_path / "c"):  # the other run really holds it
            pass
    other.release()
    store.finish_trial(during.id, "discarded", score=1.1, objective={}, timings={"total": 1.0})
    store.close()

    r = CliRunner().invoke(app, ["-w", str(ws), "status", "--json"])
    losses = json.loads(r.stdout)[0]["lease_lost"]
    assert r.exit_code == 0 and [x["retaken_at"] is None for x in losses] == [False, True]
    assert losses[1]["held_by"][0]["run"] == 8 and "was replaced" in losses[1]["reason"]
    r = CliRunner().invoke(app, ["-w", str(ws), "status"], env={"COLUMNS": "200"})
    assert "(host lease lost)" in r.output, r.output
    r = CliRunner().invoke(app, ["-w", str(ws), "why"], env={"COLUMNS": "200"})
    lines = [x.strip() for x in r.output.splitlines() if "host lease of local lost at" in x]
    assert len(lines) == 2 and "taken again at" in lines[0] and "was removed" in lines[0], r.output
    assert lines[1].endswith("not taken again: measurements after it may have shared the host")
    assert len(json.loads(CliRunner().invoke(app, ["-w", str(ws), "why", "--json"]).stdout)["lease_lost"]) == 2
    # A trial measured while the host was not this run's says so; one finished before, not.
    r = CliRunner().invoke(app, ["-w", str(ws), "why", "1"], env={"COLUMNS": "250"})
    row = next(x for x in r.output.splitlines() if x.strip().startswith("host lease"))
    assert "not taken again" in row and "was replaced" in row and "taken again at" not in row, r.output
    assert "host lease" not in CliRunner().invoke(app, ["-w", str(ws), "why", "0"]).output


def test_a_replaced_lock_file_is_a_lost_lease(tmp_path):
    lock = hostlock.acquire({"run": 1})
    path = hostlock.lease_dir() / "host.lock"
    try:
        path.rename(path.with_suffix(".old"))
        path.write_text("")
        assert not lock.held() and "was replaced" in lock.lost_reason()
        lock.take()  # nobody holds the new file: taken again
        assert lock.held() and [h["run"] for h in hostlock.holders()] == [1]
        shutil.rmtree(hostlock.lease_dir())  # the whole folder gone: lost, and taken again in a new one
        assert "was removed" in lock.lost_reason()
        lock.take()
        assert lock.held() and [h["run"] for h in hostlock.holders()] == [1]
    finally:
        lock.release()
    assert lock.lost_reason() == "it was released"
