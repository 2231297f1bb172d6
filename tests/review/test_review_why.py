"""`why` answers "why was N kept/discarded/failed/invalid/waiting, what did it change, what did it cost"
from the store alone: the run's folder (logs, bench files) is deleted before asking."""

import shutil

import pytest

from orchestrator.review import decide, explain_run, explain_trial, human_actions, record_action
from orchestrator.review.actions import DecisionError


@pytest.fixture
def no_files(finished_run):
    root, store, rid = finished_run
    shutil.rmtree(root / ".infergoal" / "runs")  # only the database is left
    return store, rid


def test_kept_on_the_keep_line_gives_score_best_threshold_and_noise(no_files):
    store, rid = no_files
    w = explain_trial(store, rid, 2)
    assert (w.status, w.decided_by) == ("kept", "threshold")
    assert w.evidence["best"] == 1.0 and w.evidence["best_trial"] == 0
    assert w.evidence["noise"] == pytest.approx(0.4 / 10.2)  # baseline repeats 10.0 and 10.4 ms
    assert w.evidence["threshold"] == pytest.approx(1.0 * (1 + 0.4 / 10.2))
    assert "1.250x beat the threshold 1.039x" in w.sentence
    assert w.changed == {"tpot_ms": 6.0}


def test_discarded_names_the_threshold_it_missed_and_the_trial_that_set_it(no_files):
    store, rid = no_files
    w = explain_trial(store, rid, 3)
    assert (w.status, w.decided_by) == ("discarded", "threshold")
    assert w.evidence["best_trial"] == 2 and w.evidence["threshold"] == pytest.approx(1.25 * (1 + 0.4 / 10.2))
    assert "1.270x did not beat the threshold 1.299x" in w.sentence and "noise 3.9%" in w.sentence
    assert w.evidence["performance"]["metrics"][0]["delta"] == pytest.approx(1 - 8.03 / 10.2)


def test_failed_at_start_up_says_so_with_the_log_tail(no_files):
    store, rid = no_files
    w = explain_trial(store, rid, 1)
    assert (w.status, w.decided_by) == ("failed", "startup")
    assert "exited before it became healthy" in w.sentence and "CUDA out of memory" in w.sentence


def test_invalid_names_the_gate_check_and_its_numbers(no_files):
    store, rid = no_files
    integrity = explain_trial(store, rid, 4)
    assert (integrity.status, integrity.decided_by) == ("invalid", "gate:integrity")
    assert {"name": "no_cache", "status": "fail", "detail": "repeated prompts answered 40x faster"} in integrity.evidence["checks"]
    accuracy = explain_trial(store, rid, 5)
    assert accuracy.decided_by == "gate:accuracy" and accuracy.evidence["metrics"]["kl_mean"] == 3.1
    assert "kl_mean=3.1 > 0.5" in accuracy.sentence


def test_needs_approval_shows_the_drift_and_approval_is_recorded_with_who(no_files):
    store, rid = no_files
    w = explain_trial(store, rid, 6)
    assert (w.status, w.decided_by) == ("needs_approval", "gate:accuracy")
    assert w.evidence["accuracy"]["metrics"] == {"kl_mean": 0.08} and "a person decides" in w.sentence
    assert w.cost["tokens"] == 1500 and w.cost["dollars"] == pytest.approx(0.0081)  # the agent's usage event
    decide(store, rid, 6, "kept", "alice")
    after = explain_trial(store, rid, 6)
    assert after.status == "kept" and after.decided_by == "approval"
    assert after.sentence.startswith("approved by alice at ") and "drift" in after.sentence
    assert [(a["kind"], a["who"]) for a in after.actions] == [("approve", "alice")]
    decide(store, rid, 9, "rejected", "bob")
    assert explain_trial(store, rid, 9).sentence.startswith("rejected by bob")
    with pytest.raises(DecisionError, match="not waiting for approval"):
        decide(store, rid, 7, "kept", "alice")


def test_the_best_what_it_changed_and_what_it_cost(no_files):
    store, rid = no_files
    best = store.get_trial(store.get_run(rid).best_trial_id)
    w = explain_trial(store, rid, best.number)
    assert (w.number, w.decided_by) == (7, "goal") and "meets every objective" in w.sentence
    assert w.changed == {"tpot_ms": 4.0}
    assert w.cost["seconds"] == pytest.approx(10.62) and w.cost["steps"]["bench"] == 6.0
    # "confirm" (a clean relaunch) is a role only databases from before paired confirmation hold:
    # explained like every other re-measurement.
    confirm = explain_trial(store, rid, 8)
    assert confirm.decided_by == "confirm" and "it judges others, not itself" in confirm.sentence


def test_run_level_why_holds_the_budget_and_the_agent_cost(no_files):
    store, rid = no_files
    r = explain_run(store, rid)
    assert r["stop_reason"].startswith("GoalMet") and r["budget"]["trials"] == 12
    assert r["used"]["trials"] == 9  # the confirm relaunch does not count against the budget
    assert r["used"]["tokens"] == 1500 and r["best"] == {"number": 7, "score": 2.0}


def test_a_host_busy_retry_does_not_count_against_the_budget(no_files):
    store, rid = no_files
    last = max(t.number for t in store.list_trials(rid))
    t = store.create_trial(rid, last + 1, commit="base", knobs={}, rationale="re-run of #3: host busier than at the baseline",
                           proposer="retry")
    store.finish_trial(t.id, "discarded", score=1.1)
    assert explain_run(store, rid)["used"]["trials"] == 9
    t = store.create_trial(rid, last + 2, commit="base", knobs={}, rationale="a search trial", proposer="search")
    store.finish_trial(t.id, "discarded", score=1.1)
    assert explain_run(store, rid)["used"]["trials"] == 10


def test_a_probe_does_not_count_against_the_budget(no_files):
    # The controller leaves the winner's probes (after the stop) out of the trial budget
    # (`roles.LOOP_ADDED`); `why` used to keep its own list without them and counted them.
    store, rid = no_files
    last = max(t.number for t in store.list_trials(rid))
    for i in (1, 2):
        t = store.create_trial(rid, last + i, commit="c0ffee", knobs={"tpot_ms": 6.0 + i},
                               rationale=f"probe: the winner #7 with tpot_ms={6.0 + i}", proposer="probe")
        store.finish_trial(t.id, "discarded", score=1.5)
    assert explain_run(store, rid)["used"]["trials"] == 9


def test_the_baseline_shows_the_noise_the_controller_judged_with(no_files):
    # Not derived again from trial #0's repeats: the noise the controller recorded for the
    # candidates judged against baseline #0 (its `trial.why` events).
    store, rid = no_files
    t2 = store.get_trial_by_number(rid, 2)
    store.add_event(rid, "trial.why", "s", trial_id=t2.id, data={
        "sentence": "#2 kept", "noise": 0.05, "baseline_trial": 0, "min_gain": 0.03})
    w = explain_trial(store, rid, 0)
    assert w.decided_by == "baseline" and w.evidence["noise"] == 0.05 and "noise at 5.0%" in w.sentence
    t0 = store.get_trial_by_number(rid, 0)  # the baseline's own record: judged against no baseline (noise 0)
    store.add_event(rid, "trial.why", "s", trial_id=t0.id, data={"sentence": "#0 kept: a baseline measurement",
                                                                 "noise": 0.0, "baseline_trial": None})
    assert explain_trial(store, rid, 0).evidence["noise"] == 0.05


def test_the_controllers_recorded_decision_and_paired_outcome_are_quoted(no_files):
    # The controller records each verdict as a `trial.why` event (score, best, threshold, noise,
    # gate verdicts, sentence) and a paired A/B as a `paired` event; `why` quotes them.
    store, rid = no_files
    t3, t4 = store.get_trial_by_number(rid, 3), store.get_trial_by_number(rid, 4)
    paired = {"trial": 3, "rounds": 3, "score": 1.22, "lo": 1.15, "hi": 1.29, "confidence": 0.9, "met": False,
              "why": "paired 1.22x [1.15, 1.29] misses 1.4x"}
    store.add_event(rid, "paired", "1.22x [1.15, 1.29]", data=paired, trial_id=t3.id)
    store.add_event(rid, "trial.why", "s", trial_id=t3.id, data={
        "sentence": "#3 discarded: score 1.270x against baseline #0 did not clear 1.310x (best 1.250x + 4.8%)",
        "threshold": 1.31, "noise": 0.048, "gates": {"performance": "fail"}, "paired": paired})
    w = explain_trial(store, rid, 3)
    assert w.sentence.startswith("#3 discarded: score 1.270x against baseline #0 did not clear 1.310x")
    assert w.evidence["threshold"] == 1.31 and w.evidence["noise"] == 0.048
    assert w.evidence["paired"]["lo"] == 1.15 and w.evidence["best_trial"] == 2  # the rest still from the store
    # a rejection is told by the gate check that made it; the record only adds evidence
    store.add_event(rid, "trial.why", "s", trial_id=t4.id, data={"sentence": "#4 invalid: integrity gate: ...",
                                                                 "gates": {"integrity": "fail"}})
    w4 = explain_trial(store, rid, 4)
    assert w4.decided_by == "gate:integrity" and "no_cache" in w4.sentence and w4.evidence["gates"] == {"integrity": "fail"}


def test_agent_usage_recorded_before_the_trial_existed_is_its_cost(no_files):
    store, rid = no_files
    store.add_event(rid, "agent.usage", "2 calls", data={"input_tokens": 5000, "output_tokens": 700,
                                                         "cache_read_input_tokens": 300, "cost_usd": 0.05,
                                                         "total_cost_usd": 0.06, "for_trial": 9})
    w = explain_trial(store, rid, 9)
    assert w.cost["tokens"] == 6000 and w.cost["dollars"] == pytest.approx(0.05)  # not the running total
    assert explain_run(store, rid)["used"]["dollars"] == pytest.approx(0.0581)


def test_interrupted_and_missing_trials(no_files):
    store, rid = no_files
    t = store.create_trial(rid, 10, commit="c0ffee", knobs={"tpot_ms": 6.0}, rationale="x", proposer="search")
    assert explain_trial(store, rid, 10).decided_by == "interrupted"  # the run is finished, the trial never ran
    assert t.status == "pending"
    with pytest.raises(LookupError, match="no trial #99"):
        explain_trial(store, rid, 99)


def test_human_actions_are_the_audit_log(no_files):
    store, rid = no_files
    record_action(store, None, "gates.relock", "gates relocked by carol", who="carol", changed=["thresholds.toml"])
    record_action(store, rid, "steer", "try bfloat16 first", who="dave")
    decide(store, rid, 9, "rejected", "erin")
    log = human_actions(store, rid)
    assert [(a["kind"], a["who"]) for a in log] == [("gates.relock", "carol"), ("steer", "dave"), ("reject", "erin")]
    assert all(a["ts"].tzinfo is not None for a in log)
