"""The whole loop on real components: the hfserve server, real gates, real bench, SQLite store.

Slow (each trial launches a real server). The kill -9 test drives the CLI as real subprocesses.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.hosts.measure import host_during
from orchestrator.remote.procs import listening_pids
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow

# Others' runnable work per CPU, the mean over the run's trials, under which the host counts as quiet
# (`hosts.measure.host_during`): 0.0-0.25 per trial on the idle 2-core machine, 1.0 beside two busy loops.
QUIET = 0.25
# Scale 0.5 keeps concurrency 4 in the throughput scenario: enough for batching to show.
FAST = ["bench.scale=0.5", "bench.baseline_repeats=1"]
# The first candidate is slower than the baseline (bfloat16 on this CPU, as SLOWER below): discarded on
# its measurement. The manual loop alone (~1.1-1.2x) screened at >= 1.2x in some runs (1.24x, 1.40x)
# and then got a paired A/B of its own (6-10 more launches, 1.09x and 1.40x: not met) before batching's.
STEPS = [
    {"knobs": {"decode_loop": "manual", "dtype": "bfloat16"}, "rationale": "own decode loop"},
    {"knobs": {"decode_loop": "manual", "batching": "on", "max_batch_size": 8}, "rationale": "batch"},
    {"knobs": {"decode_loop": "manual", "batching": "on", "max_batch_size": 16, "threads": 1}, "rationale": "one thread"},
]
# For the kill -9 test: three candidates slower than the baseline on this CPU (bfloat16 runs slower
# than float32 here: the demo's manual loop + bf16 was 0.92x, docs/results.md). None is kept, so
# no paired A/B of a winner follows the stop (6 more server launches): that test is about the kill
# and the resume, not the confirmation (tests/test_controller.py and test_loop_end_to_end judge it).
SLOWER = [
    {"knobs": {"decode_loop": "manual", "dtype": "bfloat16"}, "rationale": "own decode loop"},
    {"knobs": {"decode_loop": "manual", "dtype": "bfloat16", "batching": "on", "max_batch_size": 2}, "rationale": "batch of two"},
    {"knobs": {"dtype": "bfloat16"}, "rationale": "half the bytes"},
]


def _ws(tmp_path, steps=STEPS, extra=()):
    f = tmp_path / "steps.json"
    f.write_text(json.dumps(steps))
    return Workspace(tmp_path, [*(f"{o}" for o in FAST), f'proposer="scripted:{f}"', *extra])


def test_loop_end_to_end(tmp_path, tiny_model):
    ws = _ws(tmp_path)
    # Throughput: batching multiplies it on this CPU. (A TPOT objective is refused at this scale: the
    # naive server's per-request TPOT spread needs far more requests to resolve a 20% step.)
    goal = parse_goal("beat the baseline by 20% on throughput without accuracy loss within 4 trials")
    seen = []
    outcome = start_run(ws, goal, on_trial=seen.append)
    store = Store(ws.db_url)
    trials = store.list_trials(outcome.run_id)
    # Every row is reported once it is finished, and again if its status changes later (a paired
    # round redone as an outlier turns kept -> invalid): the last report of each is the store's.
    assert list(dict.fromkeys(t.number for t in seen)) == [t.number for t in trials], outcome.stop_reason
    last = {t.number: t.status for t in seen}
    assert last == {t.number: t.status for t in trials}
    again = {t.number for t in seen if sum(u.number == t.number for u in seen) > 1}
    assert all(t.proposer == "paired" for t in trials if t.number in again), "only a redone paired round is re-reported"
    assert trials[0].status == "kept" and trials[0].score == 1.0
    trials = [t for t in trials if t.proposer not in ("sentinel", "paired", "retry")]  # gated, not re-measurements
    assert all(t.status in ("kept", "discarded", "failed", "invalid", "needs_approval") for t in trials)
    for t in trials:
        assert {"deploy", "gates", "bench", "teardown", "record", "total"} <= set(t.timings), t.timings
        gates = {g.gate: g.status for g in store.gate_results(t.id)}
        assert gates.get("integrity") == "pass" and gates.get("accuracy") in ("pass", "drift"), (t.number, gates)
        assert Path(t.log_path).is_file() and t.launch_cmd
        assert {m.scenario for m in store.measurements(t.id)} == {"throughput"}
    best = store.get_trial(store.get_run(outcome.run_id).best_trial_id)
    assert best.number > 0 and best.score > 1.2, [(t.number, t.status, t.score, t.objective) for t in trials]
    assert outcome.stop_reason.startswith(("GoalMet", "BudgetExhausted", "ProposerExhausted"))
    if outcome.stop_reason.startswith("GoalMet"):
        assert f"#{best.number} meets every objective: paired speedup" in outcome.stop_reason, outcome.stop_reason
    # Batching is what multiplies throughput on this CPU while nothing else runs on it. With other work on
    # the cores (others' runnable work, as the loop measured it during each bench) the float32 baseline's
    # threads lose far more than the candidates', and which one wins varies: beside two busy loops on the two
    # cores the manual loop in bfloat16 won in one run (paired 16.2x [14.1, 18.7]), batching in another (50.2x).
    # Which setting wins is then the host's; the claim is still a paired one.
    others = [h["foreign_load"] for t in store.list_trials(outcome.run_id) if (h := host_during(store, outcome.run_id, t.id))]
    if others and sum(others) / len(others) < QUIET:
        assert best.knobs["batching"] == "on", ("batching is what multiplies throughput on this CPU", others)


def _wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


def test_kill_minus_9_mid_trial_then_resume(tmp_path, tiny_model):
    ws = _ws(tmp_path, SLOWER)
    steps = tmp_path / "steps.json"
    cli = [sys.executable, "-m", "orchestrator.cli", "-w", str(tmp_path), *sum((["-o", o] for o in FAST), []),
           "-o", f'proposer="scripted:{steps}"']
    goal = "improve throughput by 20x within 3 trials"  # not met: every scripted step runs
    p = subprocess.Popen([*cli, "goal", goal, "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    db = Store(ws.db_url) if (tmp_path / ".infergoal" / "infergoal.db").exists() else None

    def trial1_running():
        nonlocal db
        if db is None:
            if not (tmp_path / ".infergoal" / "infergoal.db").exists():
                return None
            db = Store(ws.db_url)
        run = db.latest_run()
        # The first scripted candidate: a baseline sentinel may come before it when the shared
        # host's load moved after the baseline (then it is #2, not #1).
        t = run and next((x for x in db.list_trials(run.id) if x.proposer == "scripted"), None)
        return t if t and t.status == "running" and t.launch_cmd else None

    t1 = _wait_for(trial1_running, 240, "the first candidate to start")
    port = int(t1.launch_cmd.split("--port ")[1].split()[0])
    _wait_for(lambda: listening_pids(port), 60, "the first candidate's server to listen")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    # The server dies with the orchestrator (PDEATHSIG); no orphan holds the port.
    _wait_for(lambda: not listening_pids(port), 15, "the orphaned server to go away")
    run_id = db.latest_run().id
    assert db.get_trial(t1.id).status == "running"

    r = subprocess.run([*cli, "resume", "--json", "--no-report"], capture_output=True, text=True, timeout=600)
    out = json.loads(r.stdout)
    # Exit codes (README): 0 goal met, 1 stopped on the budget without meeting it.
    assert (r.returncode, out["outcome"]) in ((0, "goal_met"), (1, "stopped")), r.stdout + r.stderr
    assert out["run"] == run_id
    trials = db.list_trials(run_id)
    numbers = [t.number for t in trials]
    assert numbers == list(range(len(numbers))), "no gaps, no duplicates"
    assert all(t.status not in ("pending", "running") for t in trials)
    # Sentinels and paired rounds re-measure known knob sets on purpose; the proposer's trials must not repeat.
    knob_sets = [json.dumps(t.knobs, sort_keys=True) for t in trials if t.proposer not in ("sentinel", "paired", "retry")]
    assert len(knob_sets) == len(set(knob_sets)), "the interrupted trial was re-run, not duplicated"
    t1 = db.get_trial(t1.id)
    assert t1.knobs["decode_loop"] == "manual" and t1.rationale == "own decode loop" and t1.status != "running"
    reps = [(m.scenario, m.metric, m.repeat) for m in db.measurements(t1.id)]
    assert len(reps) == len(set(reps)), "partial measurements of the killed attempt were cleared"
    assert [e.kind for e in db.events(run_id, kind="resume")], "the resume is in the audit log"
    assert db.get_run(run_id).status == "finished"
