"""Whole runs through a real sshd: the fake target with connections dropped mid-run, and one real
goal on the hfserve example with both gates and the bench running on the host."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_target import write_fake_target
from process_groups import group_alive

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.hosts.registry import HostRegistry
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # whole runs, servers launched over SSH


def _ssh_ws(tmp_path, sshd, steps, extra=()):
    state = tmp_path / ".infergoal"
    state.mkdir(exist_ok=True)
    (state / "known_hosts").write_text(sshd.known_hosts_line())
    HostRegistry(state).add(sshd.spec("box", workdir=tmp_path / "remote"))
    f = tmp_path / "steps.json"
    f.write_text(json.dumps(steps))
    return Workspace(tmp_path, ['host="box"', f'proposer="scripted:{f}"', *extra])


def _host_events(store, run_id):
    return [e for e in store.events(run_id) if e.kind == "trial.host"]


def test_run_through_ssh_goes_on_when_connections_drop(tmp_path, sshd, tiny_model):
    # Every candidate is slower than the baseline (4 ms): none is kept, so no paired A/B of a winner
    # follows the stop (6 more servers over SSH). The test is about the drops, not the confirmation.
    target = write_fake_target(tmp_path / "fake.toml", choices=(4.0, 6.0, 7.9, 8.0))
    ws = _ssh_ws(tmp_path, sshd, [{"tpot_ms": 6.0}, {"tpot_ms": 7.9}, {"tpot_ms": 8.0}],
                 [f'target="{target}"', "gates.accuracy=false", "gates.integrity=false", "bench.scale=0.5",
                  "bench.timeout_s=5"])
    drops, done = [], threading.Event()

    def dropper():
        # Kill every SSH session of the host every 6 s, whatever the trial is doing (three times: a
        # link that never holds for a worker's start-up is a dead host). A look that finds no session
        # open (the run still starting on a loaded machine) is no drop: it looks again 0.5 s later.
        wait = 6.0
        while not done.wait(wait) and len(drops) < 3:
            if n := sshd.drop_connections():
                drops.append(n)
            wait = 6.0 if n else 0.5

    t = threading.Thread(target=dropper, daemon=True)
    t.start()
    try:
        out = start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 6 trials"))
    finally:
        done.set()
        t.join()
    assert sum(drops) >= 2, f"the test must actually drop connections mid-run: {drops}"
    store = Store(ws.db_url)
    trials = store.list_trials(out.run_id)
    assert [t.number for t in trials] == list(range(len(trials))), "no trial lost, none duplicated"
    # Keep/discard follows the measured (noisy, shared-machine) speed; what the drops must not
    # cause is a failed trial: every host call and worker request was retried over a new session.
    assert all(t.status in ("kept", "discarded") for t in _own(trials)), [(t.status, t.error) for t in trials]
    assert trials[0].status == "kept" and len(trials) >= 4, [(t.status, t.error) for t in trials]
    assert out.stop_reason.startswith(("GoalMet", "ProposerExhausted", "BudgetExhausted")), out.stop_reason
    events = _host_events(store, out.run_id)
    assert sorted(e.trial_id for e in events) == sorted(t.id for t in trials), "each trial records its host once"
    fp = events[-1].data
    assert fp["host_name"] == "box" and fp["engine_tree"] and fp["model_hash"] and "python" in fp
    assert not list((tmp_path / "remote" / "servers").glob("*.json")), "every server stopped, pidfiles gone"


# Its winner meets the goal in the screen, so the stop confirms it with paired rounds over SSH (~70 s a
# round at bench.scale 1.0, about half at 0.5); on a loaded 2-core host rounds far from the others' median are redone (at most
# max_redo x 3 times): one full suite run on 2026-12-02 spent 600 s there and hit the default limit.
@pytest.mark.timeout(1200)
def test_real_goal_on_the_example_target_through_ssh(tmp_path, sshd, tiny_model):
    steps = [{"knobs": {"decode_loop": "manual", "batching": "on", "max_batch_size": 8}, "rationale": "batch"}]
    # Scale 1.0: tried at 0.5 (as tests/test_e2e.py), its paired rounds were noisier and more of them
    # were redone (docs/results.md), so the run was not shorter.
    ws = _ssh_ws(tmp_path, sshd, steps, ["bench.scale=1.0", "bench.baseline_repeats=1"])
    out = start_run(ws, parse_goal("beat the baseline by 20% on throughput without accuracy loss within 2 trials"))
    store = Store(ws.db_url)
    trials = _own(store.list_trials(out.run_id))
    assert len(trials) >= 2, out.stop_reason
    for t in trials:
        gates = {g.gate: g.status for g in store.gate_results(t.id)}
        assert gates.get("integrity") == "pass" and gates.get("accuracy") in ("pass", "drift"), (t.number, gates, t.error)
        # The bench audit ran on the host too (its worker holds the reference), on requests it measured.
        assert gates.get("audit") == "pass", (t.number, gates, t.error)
        audit = next(g for g in store.gate_results(t.id) if g.gate == "audit")
        assert audit.details["metrics"]["audit_requests"] >= 1, audit.details
        assert {"sync", "deploy", "gates", "bench", "audit"} <= set(t.timings)
        assert "-m hfserve" in t.launch_cmd, t.launch_cmd
    # The tree was placed on the host, and the servers ran there (`python -m hfserve` in it).
    assert list((tmp_path / "remote" / "trees").glob("*/hfserve/server.py")), "the tree ran on the host"
    assert trials[1].score and trials[1].score > 1.2, [(t.number, t.status, t.score, t.error) for t in trials]
    # The host (this machine) has the model at the orchestrator's own path: the trials and the
    # reference used it there, nothing was copied to the host's work dir.
    assert not (tmp_path / "remote" / "models").exists()
    assert all(e.data["model_hash"].startswith("stat:") for e in _host_events(store, out.run_id))


def _own(trials):
    """The proposer's trials: baseline sentinels and paired A/B rounds are the loop's own (controller.py)."""
    return [t for t in trials if t.proposer not in ("sentinel", "paired", "retry")]



def _wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if v := cond():
            return v
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


def test_kill_minus_9_of_the_orchestrator_then_resume_stops_the_orphan_on_the_host(tmp_path, sshd, tiny_model):
    # Both candidates are slower than the baseline (4 ms): neither is kept, so no paired A/B of a
    # winner follows the stop (6 more servers over SSH). This test is about the orphan and resume;
    # the confirmation at the stop has its own tests (tests/test_controller.py, tests/test_e2e.py).
    target = write_fake_target(tmp_path / "fake.toml", choices=(4.0, 6.0, 8.0))
    ws = _ssh_ws(tmp_path, sshd, [{"tpot_ms": 6.0}, {"tpot_ms": 8.0}], [f'target="{target}"'])
    opts = ['host="box"', f'target="{target}"', f'proposer="scripted:{tmp_path / "steps.json"}"', "gates.accuracy=false",
            "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=5"]
    cli = [sys.executable, "-m", "orchestrator.cli", "-w", str(tmp_path), *sum((["-o", o] for o in opts), [])]
    p = subprocess.Popen([*cli, "goal", "beat the baseline by 90% on TPOT within 3 trials", "--no-report"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers = tmp_path / "remote" / "servers"
    db = Path(ws.db_url.removeprefix("sqlite:///"))

    def trial1_serving():
        if not db.exists():
            return None
        store = Store(ws.db_url)
        run = store.latest_run()
        t = run and store.get_trial_by_number(run.id, 1)
        return t and t.status == "running" and list(servers.glob("*.json")) and t.launch_cmd

    _wait_for(trial1_serving, 240, "trial #1's server to start on the host")
    pgid = int(next(servers.glob("*.json")).stem)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(1)
    assert group_alive(pgid), "a server detached on the host outlives its orchestrator"
    r = subprocess.run([*cli, "resume", "--json", "--no-report"], capture_output=True, text=True, timeout=600)
    # Exit 0 = goal met, 1 = stopped on budget (README "Exit codes"); either way the run ended normally.
    assert r.returncode in (0, 1) and json.loads(r.stdout)["outcome"] in ("goal_met", "stopped"), r.stdout + r.stderr
    assert not group_alive(pgid), "resume stopped the orphan through its pidfile on the host"
    store = Store(ws.db_url)
    run_id = json.loads(r.stdout)["run"]
    swept = [e.data["orphans_killed"] for e in store.events(run_id, kind="resume") if e.data and "orphans_killed" in e.data]
    assert swept == [[pgid]]
    trials = store.list_trials(run_id)
    assert [t.number for t in trials] == list(range(len(trials))), "no trial lost, none duplicated"
    own = _own(trials)  # baseline sentinels are the loop's own trials
    assert len(own) == 3 and all(t.status in ("kept", "discarded") for t in own), [(t.status, t.error) for t in trials]
    assert not list(servers.glob("*.json"))
