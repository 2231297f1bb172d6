"""What a resumed run says: an interrupted paired round is not re-run, the bar keeps its total and
what is done, and a winner confirmed at the stop keeps what its screen said."""



from seeded_run import add_trial, controller_on, seeded_store

from orchestrator.cli.live import _Progress, resume_progress
from orchestrator.core.candidate import Candidate
from orchestrator.trial.paired import PairedOutcome
from orchestrator.trial.verdict import why_of, why_record


def test_an_interrupted_paired_round_is_not_said_to_be_re_run(tmp_path):
    store, run_id = seeded_store(tmp_path)
    add_trial(store, run_id, 0, "baseline", tpot=30.0)
    add_trial(store, run_id, 1, "search", tpot=10.0)
    pair = add_trial(store, run_id, 5, "paired", status="running")
    controller_on(store, run_id)._redo_unfinished()
    said = [e.message for e in store.events(run_id, kind="resume")]
    assert store.get_trial(pair.id).status == "invalid"
    assert len(said) == 1 and "re-running" not in said[0] and "#5" in said[0] and "not re-run" in said[0], said


def test_the_bar_of_a_resumed_run_keeps_its_total_and_what_is_done(tmp_path):
    store, run_id = seeded_store(tmp_path)
    for n, who in enumerate(("baseline", "search", "search", "sentinel", "search", "search", "search")):
        add_trial(store, run_id, n, who, tpot=30.0)
    add_trial(store, run_id, 7, "paired", status="invalid")
    add_trial(store, run_id, 8, "search", status="running")  # interrupted: counts when its re-run ends
    assert resume_progress(store, run_id) == resume_progress(store, None) == (20, 6)
    total, done = resume_progress(store, run_id)
    task = _Progress(total, True, done).progress.tasks[0]
    assert (task.total, task.completed) == (20, 6)
    assert resume_progress(store, 99) == (None, 0)


def test_a_winner_confirmed_at_the_stop_keeps_what_its_screen_said(tmp_path, monkeypatch):
    store, run_id = seeded_store(tmp_path)
    add_trial(store, run_id, 0, "baseline", tpot=[30.0, 30.3])
    t1 = add_trial(store, run_id, 1, "search", tpot=12.0, gates=[("performance", "fail")])
    c = controller_on(store, run_id)
    c._record_why(t1, "kept", 1.4, None, c._baseline(), screen_met=False)  # what _settle recorded
    outcome = PairedOutcome(trial=1, rounds=3, score=2.4, lo=2.2, hi=2.6, confidence=0.9, met=True, why="met",
                            pair_trials=[[2, 3], [4, 5], [6, 7]])
    monkeypatch.setattr("orchestrator.loop.controller.run_paired", lambda *a, **kw: outcome)
    c._confirm_paired(store.get_trial(t1.id), Candidate({"n": 1}))
    sentence = why_of(store, run_id, t1.id)
    assert "performance fail" in sentence and "paired A/B: 2.40x" in sentence
    assert "may meet the goal" not in sentence, sentence  # the screen said no; the pairs said yes
    assert why_record(store, run_id, t1.id)["screen_met"] is False
    # A trial whose screen did say so keeps saying it after its pairs.
    t2 = add_trial(store, run_id, 2, "search", tpot=10.0, gates=[("performance", "pass")])
    c._record_why(t2, "kept", 3.0, None, c._baseline(), screen_met=True)
    c._confirm_paired(store.get_trial(t2.id), Candidate({"n": 2}))
    assert "may meet the goal" in why_of(store, run_id, t2.id)
