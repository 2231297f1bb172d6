"""Which rate a trial's SLO search starts near (`orchestrator.trial.bench.reached_rate`): the newest rate
the same knob set and commit reached in this run, so a paired half, a sentinel or a retry brackets
around it instead of climbing from the scenario's start rate (orchestrator/bench/rate.py)."""

from orchestrator.store import Store
from orchestrator.trial.bench import reached_rate


def test_a_trial_starts_near_the_newest_rate_its_own_knob_set_and_commit_reached(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'infergoal.db'}")
    run = store.create_run("r", "g", {}, "h", {"name": "t"}, {}, "local", "scripted")

    def trial(n, knobs, status, rate=None, scenario="slo", commit="c0"):
        t = store.create_trial(run.id, n, commit=commit, knobs=knobs, rationale="", proposer="x")
        if rate is not None:
            store.add_measurements(t.id, scenario, {"slo_rate": rate, "ttft_ms_p90": 100.0})
        if status != "pending":
            store.finish_trial(t.id, status)
        return store.get_trial_by_number(run.id, n)

    trial(0, {"slots": 2}, "kept", 3.4)
    trial(1, {"slots": 8}, "kept", 30.4)
    trial(2, {"slots": 1}, "failed", 0.0)  # no rate met the SLO: nothing to start near
    trial(3, {"slots": 8}, "invalid", 12.0)  # a half of a redone round: not used
    trial(4, {"slots": 8}, "kept", 31.0, scenario="slo@0.5")  # another scenario (a screen's short pass)
    trial(5, {"slots": 8}, "kept", 29.0, commit="c1")  # another commit: another server
    base_half, cand_half = trial(6, {"slots": 2}, "pending"), trial(7, {"slots": 8}, "pending")
    assert reached_rate(store, run.id, base_half, "slo") == 3.4
    assert reached_rate(store, run.id, cand_half, "slo") == 30.4
    assert reached_rate(store, run.id, trial(8, {"slots": 1}, "pending"), "slo") is None
    assert reached_rate(store, run.id, trial(9, {"slots": 4}, "pending"), "slo") is None
    trial(10, {"slots": 8}, "kept", 33.0)  # the next round's half: the newest wins
    assert reached_rate(store, run.id, trial(11, {"slots": 8}, "pending"), "slo") == 33.0
    assert reached_rate(store, run.id, trial(12, {"slots": 8}, "pending", commit="c1"), "slo") == 29.0
