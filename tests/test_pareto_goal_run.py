"""A two-objective goal run end to end: the search is multi-objective, the run's answer is its front
(`infergoal trials` marks it), on the fake load server (tests/bench/loadserver.py)."""

import json

import pytest
from fake_target import FAKE_SERVER_DIR, target_head
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.core.roles import LOOP_ADDED
from orchestrator.review.pareto import run_front
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # launches (fake) servers

# More slots: more throughput under concurrent load; a slower token: more TPOT. The two knobs trade.
TARGET = target_head("loadserver", FAKE_SERVER_DIR) + '''launch = """{{ python }} {{ source }}/loadserver.py --port {{ port }} --slots {{ slots }} --ttft-ms 5 --tpot-ms {{ tpot }}"""
[knobs.slots]
type = "categorical"
choices = [1, 4]
default = 1
[knobs.tpot]
type = "categorical"
choices = [4, 2]
default = 4
'''
# The baseline's scenarios must each run >= 0.3 s (measure.TrustPolicy.min_seconds) or the run is refused:
# decode at 16 x (5 + 8 x 4 ms) = 0.59 s (8 requests, 0.30 s, was refused once in a CI run).
SCENARIOS = """
[throughput]
prompt_tokens = 16
output_tokens = 8
num_requests = 32
concurrency = 8
warmup_requests = 1
seed = 3

[decode]
prompt_tokens = 16
output_tokens = 8
num_requests = 16
concurrency = 1
warmup_requests = 1
seed = 4
"""


@pytest.mark.timeout(300)
def test_a_two_objective_goal_runs_a_multi_objective_search_and_reports_its_front(tmp_path, tiny_model):
    (tmp_path / "target.toml").write_text(TARGET)
    (tmp_path / "scenarios.toml").write_text(SCENARIOS)
    ws = Workspace(tmp_path, [f'target="{tmp_path / "target.toml"}"', "gates.accuracy=false", "gates.integrity=false",
                              'bench.scenarios="scenarios.toml"', "bench.baseline_repeats=1", "bench.repeats=1"])
    goal = parse_goal("maximize throughput and minimize p90 TPOT within 4 trials")
    out = start_run(ws, goal)
    store = Store(ws.db_url)
    trials = [t for t in store.list_trials(out.run_id) if t.proposer not in LOOP_ADDED]
    assert len(trials) == 4
    # The two-objective search proposed them: its covering start-up (3 trials with the baseline's 4) says so.
    assert all(t.rationale.startswith(("multi-objective TPE", "start-up proposal"))
               and "multi-objective" in t.rationale for t in trials[1:] if t.proposer == "search")
    front = run_front(store, out.run_id)
    assert front is not None and front.members
    rows = json.loads(CliRunner().invoke(app, ["-w", str(tmp_path), "trials", "--json"]).output)
    assert {t["number"] for t in rows if t["on_front"]} == front.numbers
