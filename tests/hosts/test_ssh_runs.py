"""Whole runs through a real sshd: the fake target with connections dropped mid-run, and one real
goal on the hfserve example with both gates and the bench running on the host."""

import json
import threading

import pytest
from fake_target import write_fake_target

from orchestrator.goal import parse_goal
from orchestrator.hosts.registry import HostRegistry
from orchestrator.runs import start_run
from orchestrator.store import Store
from orchestrator.workspace import Workspace

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
    target = write_fake_target(tmp_path / "fake.toml", choices=(8.0, 6.0, 4.0, 7.9))
    ws = _ssh_ws(tmp_path, sshd, [{"tpot_ms": 6.0}, {"tpot_ms": 7.9}, {"tpot_ms": 4.0}],
                 [f'target="{target}"', "gates.accuracy=false", "gates.integrity=false", "bench.scale=0.5",
                  "bench.timeout_s=5"])
    drops, done = [], threading.Event()

    def dropper():
        # Kill every SSH session of the host every few seconds, whatever the trial is doing
        # (a few times: a link that never holds for a worker's start-up is a dead host).
        while not done.wait(6.0) and len(drops) < 3:
            drops.append(sshd.drop_connections())

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
    assert [t.status for t in trials] == ["kept", "kept", "discarded", "kept", "kept"], [(t.status, t.error) for t in trials]
    assert out.stop_reason.startswith("GoalMet")
    events = _host_events(store, out.run_id)
    assert sorted(e.trial_id for e in events) == sorted(t.id for t in trials), "each trial records its host once"
    fp = events[-1].data
    assert fp["host_name"] == "box" and fp["engine_tree"] and fp["model_hash"] and "python" in fp
    assert not list((tmp_path / "remote" / "servers").glob("*.json")), "every server stopped, pidfiles gone"


def test_real_goal_on_the_example_target_through_ssh(tmp_path, sshd, tiny_model):
    steps = [{"knobs": {"decode_loop": "manual", "batching": "on", "max_batch_size": 8}, "rationale": "batch"}]
    ws = _ssh_ws(tmp_path, sshd, steps, ["bench.scale=0.5", "bench.baseline_repeats=1"])
    out = start_run(ws, parse_goal("beat the baseline by 20% on throughput without accuracy loss within 2 trials"))
    store = Store(ws.db_url)
    trials = store.list_trials(out.run_id)
    assert len(trials) >= 2
    for t in trials:
        gates = {g.gate: g.status for g in store.gate_results(t.id)}
        assert gates.get("integrity") == "pass" and gates.get("accuracy") in ("pass", "drift"), (t.number, gates, t.error)
        assert {"sync", "deploy", "gates", "bench"} <= set(t.timings)
        assert "server.py" in t.launch_cmd and str(tmp_path / "remote" / "trees") in t.launch_cmd, "the tree ran on the host"
    assert trials[1].score and trials[1].score > 1.2, [(t.number, t.status, t.score, t.error) for t in trials]
    # The reference model is loaded once per run on the host: one worker served every trial.
    assert len(list((tmp_path / "remote" / "models").iterdir())) == 1
