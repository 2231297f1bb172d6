"""What a resumed run says and does: an interrupted paired round is not re-run, its confirmation continues from its
whole rounds, the bar keeps its total and what is done, and a winner confirmed at the stop keeps what its screen said."""



import pytest
from seeded_run import add_trial, controller_on, seeded_store

from orchestrator.cli.live import _Progress, resume_progress
from orchestrator.core.candidate import Candidate
from orchestrator.core.roles import GoalMet
from orchestrator.trial.context import objective_label
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


# --- an interrupted paired confirmation continues from its whole rounds ----------------------------
def _pairs(tmp_path, monkeypatch, ratios, stop_at=None):
    """`run_paired` on a store whose rounds measure ratios[i] x the baseline's 100 (higher is better), with
    `run_trial` replaced; `stop_at`: the fake run_trial call (0-based, halves counted) a KeyboardInterrupt cuts."""
    from orchestrator.config.goal import parse_goal
    from orchestrator.store import Store
    from orchestrator.trial import paired
    from orchestrator.trial.context import TrialContext, TrialResult

    goal = parse_goal("improve throughput by 2x")
    label = f"{goal.objectives[0].scenario}:{goal.objectives[0].key}"
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    run = store.get_run(1) or store.create_run("r", goal.text, goal.model_dump(), goal.digest, {}, {}, "local", "search")
    cand = store.get_trial_by_number(run.id, 1) or store.create_trial(run.id, 1, commit="", knobs={"n": 2}, rationale="", proposer="search")
    it, calls = iter(ratios), []

    def fake_run_trial(ctx, row, c, **kw):
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        calls.append((c.rationale, kw["gates"]))
        return TrialResult(samples={label: [100.0 if c.rationale.endswith("baseline") else 100.0 * next(it)]})

    monkeypatch.setattr(paired, "run_trial", fake_run_trial)
    ctx = TrialContext(run_id=run.id, goal=goal, target=None, host=None, store=store, model_dir=tmp_path,
                       reference_dir=tmp_path, scenarios={}, run_dir=tmp_path)

    def create(c):
        number = max(t.number for t in store.list_trials(run.id)) + 1
        return store.create_trial(run.id, number, commit="", knobs=c.knobs, rationale=c.rationale, proposer="paired")

    resumed = paired.measured_rounds(store, run.id, 1, [label])  # what run_paired reads and continues from
    out = paired.run_paired(ctx, cand, Candidate({"n": 2}), {"n": 1}, create)
    return out, store, run.id, calls, resumed


def test_an_interrupted_paired_confirmation_continues_from_its_whole_rounds(tmp_path, monkeypatch):
    from orchestrator.trial import paired
    # Cut in round 3's candidate half (the fifth half measured): rounds 1-2 are whole, round 3 is not.
    with pytest.raises(KeyboardInterrupt):
        _pairs(tmp_path, monkeypatch, [8.3, 9.4, 8.2], stop_at=5)
    out, store, rid, calls, resumed = _pairs(tmp_path, monkeypatch, [8.2])
    assert [[a.number, b.number] for a, b in resumed] == [[2, 3], [4, 5]]
    # The round cut in half (#6 measured, #7 cut: both still running, then marked invalid on resume) is not used;
    # only round 3 is measured again, without the gates (they ran in round 1).
    assert calls == [("paired A/B of #1, round 3: baseline", False), ("paired A/B of #1, round 3: candidate", False)]
    assert out.met and out.rounds == 3 and out.pair_trials[:2] == [[2, 3], [4, 5]]
    assert out.score == pytest.approx((8.3 * 9.4 * 8.2) ** (1 / 3))
    said = [e.message for e in store.events(rid, kind="resume")]
    assert said and "2 whole rounds" in said[0] and "#2/#3, #4/#5" in said[0], said
    # Its rounds are used now: a later confirmation of the same trial starts afresh.
    store.add_event(rid, "paired", "#1: met", data=out.to_dict(), trial_id=store.get_trial_by_number(rid, 1).id)
    assert paired.measured_rounds(store, rid, 1) == [] and paired.interrupted(store, rid) is None


def test_a_resumed_confirmation_with_enough_whole_rounds_is_judged_before_measuring_another(tmp_path, monkeypatch):
    from orchestrator.store import Store
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    run = store.create_run("r", "g", {}, "d", {}, {}, "local", "search")
    store.create_trial(run.id, 1, commit="", knobs={"n": 2}, rationale="", proposer="search")
    for rnd, ratio in enumerate((8.3, 9.4, 8.2), start=1):  # three whole rounds, cut before the outcome was recorded
        for role, value in (("baseline", 100.0), ("candidate", 100.0 * ratio)):
            t = store.create_trial(run.id, 2 * rnd + (role == "candidate"), commit="", knobs={},
                                   rationale=f"paired A/B of #1, round {rnd}: {role}", proposer="paired")
            store.finish_trial(t.id, "kept", objective={"throughput:output_throughput": value})
    out, store, rid, calls, resumed = _pairs(tmp_path, monkeypatch, [])
    assert len(resumed) == 3 and calls == [] and out.met and out.rounds == 3
    assert out.pair_trials == [[2, 3], [4, 5], [6, 7]]


def test_a_confirmation_cut_before_its_first_whole_round_starts_again_before_proposing(tmp_path, monkeypatch):
    store, run_id = seeded_store(tmp_path)
    add_trial(store, run_id, 0, "baseline", tpot=30.0)
    t1 = add_trial(store, run_id, 1, "search", tpot=10.0)
    base_half = store.create_trial(run_id, 2, commit="", knobs={"n": 0}, rationale="paired A/B of #1, round 1: baseline",
                                   proposer="paired")
    store.finish_trial(base_half.id, "kept", objective={"decode:tpot_ms_p50": 30.0})
    cut = store.create_trial(run_id, 3, commit="", knobs={"n": 1}, rationale="paired A/B of #1, round 1: candidate",
                             proposer="paired")  # the kill came while its candidate half ran
    seen = {}

    def fake_run_paired(ctx, trial, candidate, base, create, **kw):
        from orchestrator.trial import paired
        seen.update(trial=trial.number, resumed=paired.measured_rounds(ctx.store, ctx.run_id, trial.number))
        return PairedOutcome(trial=trial.number, rounds=3, score=3.0, lo=2.8, hi=3.2, confidence=0.9, met=True, why="met",
                             pair_trials=[[4, 5], [6, 7], [8, 9]])

    monkeypatch.setattr("orchestrator.loop.controller.run_paired", fake_run_paired)
    c = controller_on(store, run_id)
    with pytest.raises(GoalMet):
        c._start()  # before any proposal: the search does not go on while #1's screen says it may meet the goal
    assert seen == {"trial": 1, "resumed": []}
    assert store.get_trial(cut.id).status == "invalid"
    said = [e.message for e in store.events(run_id, kind="resume")]
    assert any("paired A/B of #1 starts again" in m for m in said), said
    assert store.get_run(run_id).best_trial_id == t1.id


def test_a_confirmed_trial_is_never_taken_for_an_interrupted_one(tmp_path):
    from orchestrator.store import Store
    from orchestrator.trial import paired
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    run = store.create_run("r", "g", {}, "d", {}, {}, "local", "search")
    t1 = store.create_trial(run.id, 1, commit="", knobs={}, rationale="", proposer="search")
    for number, role, status in ((2, "baseline", "kept"), (3, "candidate", "failed")):  # abandoned: its candidate failed
        t = store.create_trial(run.id, number, commit="", knobs={}, rationale=f"paired A/B of #1, round 1: {role}",
                               proposer="paired")
        store.finish_trial(t.id, status, objective={"c:x": 1.0})
    assert paired.interrupted(store, run.id) == 1
    store.add_event(run.id, "paired", "#1: not confirmed", data={"pair_trials": []}, trial_id=t1.id)
    assert paired.interrupted(store, run.id) is None


def test_a_redone_or_abandoned_round_never_counts_on_resume(tmp_path):
    from orchestrator.store import Store
    from orchestrator.trial import paired
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    run = store.create_run("r", "g", {}, "d", {}, {}, "local", "search")
    store.create_trial(run.id, 1, commit="", knobs={}, rationale="", proposer="search")

    def half(number, rnd, role, status, of=1):
        t = store.create_trial(run.id, number, commit="", knobs={}, rationale=f"paired A/B of #{of}, round {rnd}: {role}",
                               proposer="paired")
        store.finish_trial(t.id, status, objective={"c:x": 1.0})

    half(2, 1, "baseline", "invalid"), half(3, 1, "candidate", "invalid")  # redone as an outlier
    half(4, 1, "baseline", "kept"), half(5, 1, "candidate", "invalid")  # abandoned: its other half failed
    half(6, 1, "baseline", "kept"), half(7, 1, "candidate", "kept")  # whole
    half(8, 2, "baseline", "kept")  # cut in half
    half(9, 1, "baseline", "kept", of=7), half(10, 1, "candidate", "kept", of=7)  # another trial's
    assert [(a.number, b.number) for a, b in paired.measured_rounds(store, run.id, 1)] == [(6, 7)]
    assert paired.measured_rounds(store, run.id, 1, ["c:y"]) == []  # not the goal's objective
    assert paired.interrupted(store, run.id) == 7


def test_resume_continues_the_cut_confirmation_before_proposing(tmp_path, monkeypatch):
    store, run_id = seeded_store(tmp_path)
    add_trial(store, run_id, 0, "baseline", tpot=30.0)
    t1 = add_trial(store, run_id, 1, "search", tpot=10.0)
    for n, role in ((2, "baseline"), (3, "candidate")):
        t = store.create_trial(run_id, n, commit="", knobs={"n": 0 if role == "baseline" else 1},
                               rationale=f"paired A/B of #1, round 1: {role}", proposer="paired")
        store.finish_trial(t.id, "kept", objective={"decode:tpot_ms_p50": 30.0 if role == "baseline" else 10.0})
    add_trial(store, run_id, 4, "paired", status="running")
    seen = {}

    def fake_run_paired(ctx, trial, candidate, base, create, **kw):
        from orchestrator.trial import paired  # the whole rounds run_paired continues from, as it is called
        labels = [objective_label(o.scenario, o.key) for o in ctx.goal.objectives]
        seen.update(trial=trial.number,
                    resumed=[(a.number, b.number) for a, b in paired.measured_rounds(ctx.store, ctx.run_id, trial.number, labels)])
        return PairedOutcome(trial=trial.number, rounds=3, score=3.0, lo=2.8, hi=3.2, confidence=0.9, met=True, why="met",
                             pair_trials=[[2, 3], [5, 6], [7, 8]])

    monkeypatch.setattr("orchestrator.loop.controller.run_paired", fake_run_paired)
    c = controller_on(store, run_id)
    with pytest.raises(GoalMet):
        c._start()
    assert seen == {"trial": 1, "resumed": [(2, 3)]}
    assert store.get_trial(store.get_trial_by_number(run_id, 4).id).status == "invalid"
    assert store.get_run(run_id).best_trial_id == t1.id
