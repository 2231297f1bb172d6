"""A run stopped from outside (SIGINT/SIGTERM, a command's time limit), here in the paired rounds at
its stop, still leaves what it learned in the knowledge base: the best kept trial as an unconfirmed
winner (`hypothesis`, its evidence says why), the knob effects; a run on another model reads it as a
prior. On the H200 (2026-12-02) the 2B run kept 1.33x, was killed by `timeout -s INT` in those rounds,
and wrote nothing: the 7B run after it started cold.

Fast: the controller on the fake host of tests/test_fidelity.py (no server is launched)."""

from __future__ import annotations

import pytest
from fake_target import write_fake_target
from test_fidelity import CHOICES, FakeHost

from orchestrator.bench.saturation import SaturationPolicy
from orchestrator.bench.scenarios import builtin_scenarios
from orchestrator.config.goal import parse_goal
from orchestrator.core.roles import PAIRED
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.knowledge import KnowledgeBase, parse_entry
from orchestrator.loop.controller import Controller
from orchestrator.proposers import ScriptedProposer
from orchestrator.store import Store
from orchestrator.targets import load_target
from orchestrator.trial.context import TrialContext

CPU2 = {"machine": "x86_64", "cpu_count": 2, "gpus": []}
STOPPED = "the run was interrupted (SIGINT/SIGTERM) before its stop"


def _controller(tmp_path, store, run_id, target, on_trial=None):
    # 8 -> 1.6 ms is out of reach: the run stops on its budget, then confirms its best (paired rounds).
    goal = parse_goal("beat the baseline by 80% on TPOT within 2 trials")
    ctx = TrialContext(run_id=run_id, goal=goal, target=target, host=FakeHost(), store=store, model_dir=tmp_path,
                       reference_dir=tmp_path, scenarios=builtin_scenarios(0.5), run_dir=tmp_path / "run",
                       source_dir=tmp_path, accuracy_gate=False, integrity_gate=False,
                       trust=TrustPolicy(probe_s=0.0, settle_s=0.0, saturation=SaturationPolicy(max_client_cpu=float("inf"))))
    return Controller(ctx, ScriptedProposer([{"tpot_ms": 5.0}, {"tpot_ms": 6.0}]), on_trial=on_trial)


def _write(kb_dir, store, run_id, model="forge:tiny", interrupted=None):
    kb = KnowledgeBase([kb_dir], write_dir=kb_dir)
    return kb.write_back(store, run_id, engine="fake", model=model, hardware=CPU2, workload="decode@0.5", interrupted=interrupted)


def test_a_run_interrupted_in_its_paired_rounds_leaves_a_finding_the_next_model_reads_as_a_prior(tmp_path):
    target = load_target(write_fake_target(tmp_path / "fake.toml", choices=CHOICES))
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    run = store.create_run("r", "g", {}, "h", {}, {}, "fake", "scripted")

    def stop_in_the_paired_rounds(trial):
        if trial.proposer == PAIRED:
            raise KeyboardInterrupt  # what `timeout -s INT` does to the run there

    with pytest.raises(KeyboardInterrupt):
        _controller(tmp_path, store, run.id, target, stop_in_the_paired_rounds).run()
    assert store.get_run(run.id).status == "stopped"
    best = store.get_trial(store.get_run(run.id).best_trial_id)
    assert best.knobs["tpot_ms"] == 5.0 and best.score == pytest.approx(1.6)
    kb_dir = tmp_path / "kb"
    path = _write(kb_dir, store, run.id, interrupted=STOPPED)
    winner = parse_entry(path)
    assert winner.status == "hypothesis" and winner.meta["knobs"]["tpot_ms"] == 5.0
    [ev] = winner.meta["evidence"]
    assert ev["confirmed_by_relaunch"] is False and ev["unconfirmed"].startswith("not confirmed by paired rounds: the run was")
    assert "stopped before this was confirmed" in winner.body
    assert list((kb_dir / "findings").glob("*knob-effects*"))  # which knob moved what: written too

    # The next run, on another model of the same setting, starts from it: a warm start and priors,
    # weighted as a hypothesis (0.6 x the similarity).
    kb = KnowledgeBase([kb_dir], write_dir=kb_dir)
    here = dict(engine="fake", model="forge:small", hardware=CPU2, workload="decode@0.5")
    assert {"tpot_ms": 5.0}.items() <= kb.warm_start(**here)[0].items()
    priors = kb.prior_observations(**here)
    assert priors and max(p["weight"] for p in priors) <= 0.6 and {p["score"] for p in priors} >= {1.6}

    # Resumed to its end, the run writes again: its evidence is replaced (one entry, now with the
    # paired rounds), not added to; not confirmed (the goal is out of reach), so still a hypothesis.
    reason = _controller(tmp_path, store, run.id, target).run()
    assert reason.startswith("BudgetExhausted") and "paired speedup" in reason
    again = parse_entry(_write(kb_dir, store, run.id))
    [ev] = again.meta["evidence"]
    assert "unconfirmed" not in ev and ev["paired"]["goal_met"] is False and again.status == "hypothesis"
    assert "stopped before" not in again.body


def test_an_unconfirmed_win_does_not_promote_another_runs_finding_and_a_confirmed_rewrite_does(tmp_path):
    """The same knob set kept by an earlier run: a stopped run's unconfirmed win leaves its status; the
    same run resumed and confirmed promotes it once."""
    from kbfixtures import make_run

    store = Store("sqlite://")
    kb_dir = tmp_path / "kb"
    first = make_run(store, [({"batching": "on"}, "kept", 2.0, {"throughput:output_tps": 50.0}, None)], best=1, stop="GoalMet: x")
    path = _write(kb_dir, store, first)
    assert parse_entry(path).status == "probable"
    second = make_run(store, [({"batching": "on"}, "kept", 2.2, {"throughput:output_tps": 55.0}, None)], best=1, stop="interrupted")
    assert _write(kb_dir, store, second, interrupted=STOPPED) == path
    meta = parse_entry(path).meta
    assert parse_entry(path).status == "probable" and len(meta["evidence"]) == 2 and "unconfirmed" in meta["evidence"][1]
    store.set_run_status(second, "finished", stop_reason="GoalMet: confirmed after the resume")
    _write(kb_dir, store, second)
    meta = parse_entry(path).meta
    assert parse_entry(path).status == "confirmed" and len(meta["evidence"]) == 2 and "unconfirmed" not in meta["evidence"][1]
