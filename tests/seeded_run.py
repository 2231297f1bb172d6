"""A run seeded straight into a store (trials with measurements and gate results) and a controller over it,
for judging and resume tests that need no server."""

from types import SimpleNamespace

from orchestrator.config.goal import parse_goal
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.loop.controller import Controller
from orchestrator.store import Store

GOAL = parse_goal("beat the baseline by 20% on TPOT without accuracy loss within 20 trials")
TPOT = "decode:tpot_ms_p50"


def seeded_store(tmp_path, goal=GOAL):
    store = Store(f"sqlite:///{tmp_path / 'infergoal.db'}")
    run = store.create_run("r", goal.text, goal.model_dump(mode="json"), goal.digest, {"name": "t"}, {}, "local", "search")
    return store, run.id


def add_trial(store, run_id, number, proposer, status="kept", tpot=None, accuracy=None, gates=()):
    t = store.create_trial(run_id, number, commit="", knobs={"n": number}, rationale=f"#{number}", proposer=proposer)
    if accuracy is not None:
        store.add_gate_result(t.id, "accuracy", "drift", "r", {"metrics": accuracy}, 1.0)
    for gate, status_ in gates:
        store.add_gate_result(t.id, gate, status_, "r", {}, 0.0)
    if tpot is not None:
        for rep, v in enumerate([tpot] if isinstance(tpot, float) else tpot):
            store.add_measurements(t.id, "decode", {"tpot_ms_p50": v}, repeat=rep)
    if status not in ("pending", "running"):
        store.finish_trial(t.id, status, score=1.0 if number == 0 else 1.5, objective={TPOT: tpot if isinstance(tpot, float) else 0.0})
    return store.get_trial(t.id)


def controller_on(store, run_id, **target):
    ctx = SimpleNamespace(run_id=run_id, store=store, goal=GOAL, on_step=lambda s: None, trust=TrustPolicy(), base_commit="",
                          target=SimpleNamespace(baseline_knobs=lambda: {"n": 0}, **target))
    return Controller(ctx, proposer=None)


