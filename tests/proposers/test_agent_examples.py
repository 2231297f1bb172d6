"""The shipped agent example config and GPU goal load, and build the proposer they name."""

import shutil
from pathlib import Path

from messages_api import API_KEY

from orchestrator.goal import load_goal
from orchestrator.proposers import get_proposer
from orchestrator.proposers.hybrid import HybridProposer
from orchestrator.workspace import PACKAGE_ROOT, Workspace

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
