"""Two live runs in one workspace and a `resume`: no server of a live run is touched.

A defect once seen: `resume 1` while runs 1 and 2 were live killed both runs' servers. Here two
real CLI processes drive runs on the torch-free fake target (opted in to sharing the host), a
third run was killed and left an orphan server behind, and then:
- `resume 1` and `resume 2` are refused (exit 5) and name the owner,
- `resume 3` sweeps exactly the orphan of run 3, and the live runs go on without a failed trial.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_target import write_fake_target
from process_groups import group_alive

from orchestrator.hosts.runlease import is_live
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # launches (fake) servers and three orchestrator processes

ROOT = Path(__file__).resolve().parent.parent
ENV = os.environ | {"PYTHONPATH": str(ROOT)}
ORPHAN_ARGV = [sys.executable, "-c", "import time; time.sleep(600)"]


def _cli(ws: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "-w", str(ws), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, **kw)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid



def _servers_by_run(ws: Path) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for f in (ws / ".infergoal" / "servers").glob("*.json"):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out.setdefault(d.get("run_id"), set()).add(d["pgid"])
    return out


def test_resume_with_two_live_runs_touches_no_live_server(tmp_path, tiny_model):
    # Each live run's second trial (tpot 7.8 ms) does not come up while `hold` exists, so both runs
    # are surely live, each with a server up, for the whole test (on a quiet machine a run could
    # otherwise stall out before the resumes); run 3's one trial (7.9 ms) is not held.
    hold = tmp_path / "hold"
    hold.touch()
    target = write_fake_target(tmp_path / "fake.toml", choices=(8.0, 7.9, 7.8), ready_timeout_s=600,
                               extra_launch=f"{{% if tpot_ms == 7.8 %}} --hold-while {hold} {{% endif %}}")
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"tpot_ms": v} for v in (7.9, 7.8) * 20]))
    common = ["-o", f"target={json.dumps(str(target))}", "-o", f"proposer={json.dumps('scripted:' + str(steps))}",
              "-o", "gates.accuracy=false", "-o", "gates.integrity=false", "-o", "bench.scale=0.5",
              "-o", "allow_concurrent_runs=true"]
    goal = "beat the baseline by 60% on TPOT within 40 trials"  # unreachable: the runs keep going
    live = [_cli(tmp_path, *common, "goal", "--no-report", goal)]
    db = tmp_path / ".infergoal" / "infergoal.db"
    orphan = None
    try:
        deadline = time.monotonic() + 120
        while not (db.exists() and Store(f"sqlite:///{db}").list_runs()):
            assert time.monotonic() < deadline and live[0].poll() is None, live[0].communicate()
            time.sleep(0.5)
        live.append(_cli(tmp_path, *common, "goal", "--no-report", goal))
        store = Store(f"sqlite:///{db}")
        # Wait until both runs are live and each has a server up at the same moment.
        while True:
            runs = store.list_runs()
            by_run = _servers_by_run(tmp_path)
            if len(runs) == 2 and all(is_live(r) for r in runs) and all(by_run.get(r.id) for r in runs):
                break
            assert time.monotonic() < deadline, ([(r.id, r.status) for r in runs], by_run)
            assert all(p.poll() is None for p in live), [p.communicate() for p in live]
            time.sleep(0.3)
        r1, r2 = runs
        # Run 3 was killed: its row says running, its owner is dead, its server was left behind.
        g = dict(r1.goal, budget=dict(r1.goal["budget"], trials=1))
        r3 = store.create_run("killed", r1.goal_text, g, r1.goal_hash, r1.target, r1.config, r1.host, r1.proposer)
        dead = _dead_pid()
        store.claim_run(r3.id, owner_host=os.uname().nodename, owner_pid=dead, check=lambda r, o: None)
        t0 = store.create_trial(r3.id, 0, commit="", knobs={"tpot_ms": 8.0}, rationale="baseline", proposer="baseline")
        store.finish_trial(t0.id, "kept", score=1.0, objective={}, timings={"total": 1.0})
        orphan = subprocess.Popen(ORPHAN_ARGV, start_new_session=True)
        (tmp_path / ".infergoal" / "servers" / f"{orphan.pid}.json").write_text(json.dumps(
            {"pgid": orphan.pid, "argv": ORPHAN_ARGV, "run_id": r3.id, "owner_pid": dead}))

        for rid in (r1.id, r2.id):
            p = _cli(tmp_path, "resume", str(rid), "--no-report")
            out, errs = p.communicate(timeout=120)
            assert p.returncode == 5, (out, errs)
            assert f"run {rid} is live" in errs and "pid" in errs and "Traceback" not in errs

        p = _cli(tmp_path, "resume", str(r3.id), "--no-report", "--json")
        out, errs = p.communicate(timeout=180)
        assert p.returncode == 1 and json.loads(out)["outcome"] == "stopped", (out, errs)  # budget of 1 spent
        swept = [e.data["orphans_killed"] for e in store.events(r3.id, kind="resume")]
        assert swept == [[orphan.pid]], swept
        orphan.wait(timeout=10)

        # The live runs went on untouched: still live, no trial lost to a killed server.
        time.sleep(1.0)
        for r in (r1, r2):
            assert is_live(store.get_run(r.id)), store.get_run(r.id)
            bad = [(t.number, t.error) for t in store.list_trials(r.id) if t.status in ("failed", "invalid")]
            assert bad == [], bad
            assert store.events(r.id, kind="resume") == []
        assert all(p.poll() is None for p in live)
    finally:
        for p in live:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in live:
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        if orphan is not None and orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    # Ctrl-C: both runs stopped and saved; no server of theirs is left running.
    for r in Store(f"sqlite:///{db}").list_runs()[:2]:
        assert r.status == "stopped" and r.heartbeat_at is None, r
    deadline = time.monotonic() + 15
    while (left := {pg for pgs in _servers_by_run(tmp_path).values() for pg in pgs if group_alive(pg)}):
        assert time.monotonic() < deadline, (left, _servers_by_run(tmp_path), [Path(f"/proc/{pg}/cmdline").read_bytes() for pg in left])
        time.sleep(0.2)


def test_a_run_started_with_sigint_ignored_still_stops_cleanly_on_sigint(tmp_path, tiny_model):
    # A process started from a background job (`cmd &` in a script, nohup) inherits SIGINT ignored;
    # the CLI takes it back, so SIGINT (Ctrl-C, the shell's /stop) still stops the run cleanly.
    hold = tmp_path / "hold"
    hold.touch()  # trial #1 stays in flight until the test is done with it
    target = write_fake_target(tmp_path / "fake.toml", choices=(8.0, 7.9), ready_timeout_s=600,
                               extra_launch=f"{{% if tpot_ms == 7.9 %}} --hold-while {hold} {{% endif %}}")
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"tpot_ms": 7.9}]))
    p = _cli(tmp_path, "-o", f"target={json.dumps(str(target))}", "-o", f"proposer={json.dumps('scripted:' + str(steps))}",
             "-o", "gates.accuracy=false", "-o", "gates.integrity=false", "-o", "bench.scale=0.5",
             "goal", "--no-report", "beat the baseline by 60% on TPOT within 3 trials",
             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    db = tmp_path / ".infergoal" / "infergoal.db"
    deadline = time.monotonic() + 120
    while not (db.exists() and (runs := Store(f"sqlite:///{db}").list_runs())
               and any(t.number == 1 for t in Store(f"sqlite:///{db}").list_trials(runs[0].id))):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    try:
        out, errs = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("SIGINT was ignored: the run had to be killed")
    run = Store(f"sqlite:///{db}").list_runs()[0]
    assert run.status == "stopped" and run.heartbeat_at is None, (run, errs)
    assert not any(group_alive(pg) for pgs in _servers_by_run(tmp_path).values() for pg in pgs)
