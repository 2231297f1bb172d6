"""After a paired A/B, "score X against baseline #N" is still the screening score
against #N; the paired ratio is told as paired (the trial's own score becomes the paired one)."""

from types import SimpleNamespace

from orchestrator.config.goal import parse_goal
from orchestrator.core.candidate import Candidate
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.loop.controller import Controller
from orchestrator.store import Store
from orchestrator.trial.paired import PairedOutcome
from orchestrator.trial.verdict import why_record

GOAL = parse_goal("beat the baseline by 20% on TPOT within 20 trials")


def test_the_why_after_a_paired_ab_keeps_the_screening_score_against_its_baseline(tmp_path, monkeypatch):
    store = Store(f"sqlite:///{tmp_path / 'infergoal.db'}")
    run = store.create_run("r", GOAL.text, GOAL.model_dump(mode="json"), GOAL.digest, {"name": "t"}, {}, "local", "search")
    for n, proposer, tpots, score in ((0, "baseline", [30.0, 30.3], 1.0), (1, "search", [7.4], 4.05)):
        t = store.create_trial(run.id, n, commit="", knobs={"n": n}, rationale="", proposer=proposer)
        for rep, v in enumerate(tpots):
            store.add_measurements(t.id, "decode", {"tpot_ms_p50": v}, repeat=rep)
        store.finish_trial(t.id, "kept", score=score, objective={"decode:tpot_ms_p50": tpots[0]})
    ctx = SimpleNamespace(run_id=run.id, store=store, goal=GOAL, on_step=lambda s: None, trust=TrustPolicy(), base_commit="",
                          target=SimpleNamespace(baseline_knobs=lambda: {"n": 0}))
    c = Controller(ctx, proposer=None)
    t1 = store.get_trial_by_number(run.id, 1)
    c._record_why(t1, "kept", 4.05, None, c._baseline(), screen_met=True)
    outcome = PairedOutcome(trial=1, rounds=3, score=6.629, lo=6.2, hi=7.0, confidence=0.9, met=True, why="met",
                            pair_trials=[[2, 3], [4, 5], [6, 7]])
    monkeypatch.setattr("orchestrator.loop.controller.run_paired", lambda *a, **kw: outcome)
    c._confirm_paired(t1, Candidate({"n": 1}))
    rec = why_record(store, run.id, t1.id)
    assert store.get_trial(t1.id).score == 6.629  # the trial's number is the paired one
    assert rec["score"] == 4.05 and rec["baseline_trial"] == 0 and rec["paired"]["score"] == 6.629
    assert "score 4.050x against baseline #0" in rec["sentence"] and "score 6.629x" not in rec["sentence"]
    assert "paired A/B: 6.63x [6.20, 7.00]" in rec["sentence"]
    store.close()
