"""The shipped agent example config and GPU goal load, and build the proposer they name."""

import shutil
from pathlib import Path

from messages_api import API_KEY

from orchestrator.config.goal import load_goal
from orchestrator.config.workspace import PACKAGE_ROOT, Workspace
from orchestrator.proposers import get_proposer
from orchestrator.proposers.hybrid import HybridProposer

EXAMPLE = PACKAGE_ROOT / "examples" / "agent" / "infergoal.toml"


def test_agent_example_config_builds_the_hybrid_proposer(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    shutil.copy(EXAMPLE, tmp_path / "infergoal.toml")
    c = Workspace(tmp_path).config
    assert c.proposer == "hybrid" and c.agent.max_cost_usd == 20.0 and c.agent.hybrid_search_trials == 3
    p = get_proposer(c.proposer, agent=c.agent)
    assert isinstance(p, HybridProposer) and p.n_tune == 3 and p.agent.cfg.model == c.agent.model


def test_gpu_goal_for_the_hybrid_loads():
    g = load_goal(PACKAGE_ROOT / "examples" / "goals" / "hybrid_gpu.toml")
    assert {o.metric for o in g.objectives} == {"throughput", "tpot"} and g.accuracy_mode == "no_loss"
    assert g.budget.trials == 30 and g.budget.wall_s == 7200


def test_the_hybrid_tunes_a_two_objective_goal_with_the_multi_objective_search(monkeypatch):
    """A two-objective goal (a Pareto front) run by the hybrid: its knob tuning is the multi-objective
    search a `search` run of that goal gets, not the scalar one."""
    from types import SimpleNamespace

    import orchestrator.proposers.hybrid as hybrid

    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    from orchestrator.config.goal import parse_goal

    g = parse_goal("maximize throughput and minimize p90 TPOT within 20 trials")
    p = get_proposer("hybrid", objectives=g.objectives if g.multi_objective else ())
    built = []

    class Spy:
        def __init__(self, **kw):
            built.append(kw)

        def propose(self, history, target):
            return SimpleNamespace(knobs={"x": 1}, extra={}, rationale="spy")

    monkeypatch.setattr(hybrid, "SearchProposer", Spy)
    agent_trial = SimpleNamespace(number=1, proposer=p.agent.name, status="kept", commit="abc")
    c = p.propose([agent_trial], target=None)
    assert c.proposer == hybrid.TUNE and c.commit == "abc"
    assert g.multi_objective and [o.metric for o in built[0]["objectives"]] == [o.metric for o in g.objectives]
