"""A goal with two objectives is searched by Optuna's multi-objective TPE on the measured values."""

import math
import sys
from pathlib import Path

import optuna

from orchestrator.audit.pareto import front_of
from orchestrator.goal import parse_goal
from orchestrator.proposers import get_proposer, multi
from orchestrator.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import kb_table as T  # noqa: E402

TARGET = T.grid_target()
GOAL = parse_goal("maximize throughput and minimize p90 TPOT within 20 trials")
TPUT, TPOT = "throughput:output_throughput", "decode:tpot_ms_p90"


def measure(k):
    """A stub server: batching trades TPOT for throughput; sdpa helps both; manual decode hurts both."""
    batch = k["max_batch_size"] if k["batching"] == "on" else 1
    speed = (1.3 if k["attn"] == "sdpa" else 1.0) * (0.7 if k["decode_loop"] == "manual" else 1.0)
    return {TPUT: 20.0 * math.sqrt(batch) * speed, TPOT: (30.0 + 4.0 * batch) / speed}


def _run(store, proposer, n):
    run = store.create_run("r", GOAL.text, GOAL.model_dump(), GOAL.digest, {}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs=TARGET.baseline_knobs(), rationale="", proposer="baseline")
    base = measure(TARGET.baseline_knobs())
    store.finish_trial(t0.id, "kept", score=1.0, objective=base)
    for i in range(1, n):
        c = proposer.propose(store.list_trials(run.id), TARGET)
        t = store.create_trial(run.id, i, commit="", knobs=c.knobs, rationale=c.rationale, proposer="search")
        m = measure(c.knobs)
        score = math.sqrt(m[TPUT] / base[TPUT] * base[TPOT] / m[TPOT])
        store.finish_trial(t.id, "kept", score=score, objective=m)
    return run.id


def test_the_study_has_one_direction_per_objective_and_is_told_the_measured_values(tmp_path, monkeypatch):
    made = []
    real = optuna.create_study

    def spy(**kw):
        made.append(kw)
        return real(**kw)

    monkeypatch.setattr(optuna, "create_study", spy)
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    p = get_proposer("search", objectives=GOAL.objectives)
    rid = _run(store, p, 8)
    assert made and all(kw.get("directions") == ["maximize", "minimize"] for kw in made)
    trials = store.list_trials(rid)
    assert all(t.rationale.startswith("multi-objective TPE") for t in trials[1:])
    assert multi.values_of(trials[3], GOAL.objectives, [0.0, 1.0]) == [trials[3].objective[TPUT], trials[3].objective[TPOT]]


def test_a_single_objective_goal_keeps_the_scalar_search(tmp_path):
    p = get_proposer("search", objectives=parse_goal("improve throughput by 2x").objectives)
    assert p.objectives == []


def test_failed_trials_are_told_worse_than_anything_measured(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    run = store.create_run("r", GOAL.text, GOAL.model_dump(), GOAL.digest, {}, {}, "local", "search")
    ok = store.create_trial(run.id, 0, commit="", knobs={}, rationale="", proposer="baseline")
    store.finish_trial(ok.id, "kept", score=1.0, objective={TPUT: 50.0, TPOT: 40.0})
    bad = store.create_trial(run.id, 1, commit="", knobs={}, rationale="", proposer="search")
    store.finish_trial(bad.id, "failed", error="oom")
    history = store.list_trials(run.id)
    failed = multi.failed_values(history, GOAL.objectives)
    assert failed == [0.0, 400.0]
    assert multi.values_of(history[1], GOAL.objectives, failed) == failed


def test_the_multi_objective_search_finds_a_wider_front_than_random_sampling(tmp_path):
    """Same budget (16 trials), same stub: the MOTPE run's front dominates more of the objective
    space (hypervolume) than a run that samples knob sets at random."""
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")

    class Random:
        def __init__(self):
            import random
            self.grid = T.knob_grid(TARGET)
            random.Random(0).shuffle(self.grid)

        def propose(self, history, target):
            from orchestrator.candidate import Candidate
            return Candidate(knobs=self.grid[len(history)], rationale="random", proposer="random")

    def hypervolume(rid):
        front = front_of(store.list_trials(rid), GOAL.objectives).members
        ref_tpot = 300.0  # worse than any measured TPOT; throughput's reference is 0
        pts = sorted(((p[TPUT], p[TPOT]) for p in front), key=lambda x: x[1])
        area, prev_t = 0.0, 0.0
        for tput, tpot in sorted(pts, key=lambda x: x[0]):  # by rising throughput, TPOT rises on a front
            area += (tput - prev_t) * (ref_tpot - tpot)
            prev_t = tput
        return area, len(front)

    mo, n_mo = hypervolume(_run(store, get_proposer("search", objectives=GOAL.objectives), 16))
    rnd, _ = hypervolume(_run(store, Random(), 16))
    assert n_mo >= 2  # a trade-off, not one point
    assert mo > rnd
