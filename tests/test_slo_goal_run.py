"""An SLO goal run end to end: the loop scores each server by the highest request rate meeting the
goal's limits, over the baseline's (tests/bench/loadserver.py: its capacity is slots / service time)."""

import json

import pytest
from fake_target import FAKE_SERVER_DIR, target_head

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.core.roles import LOOP_ADDED
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # launches (fake) servers; each trial is a rate search (~5-15 s)

TARGET = target_head("loadserver", FAKE_SERVER_DIR) + '''launch = """{{ python }} {{ source }}/loadserver.py --port {{ port }} --slots {{ slots }} --ttft-ms 40 --tpot-ms 50"""
[knobs.slots]
type = "categorical"
choices = [4, 16, 1]
default = 4
'''
# Steps of the search start at 8 req/s; 4-token outputs: service 190 ms, capacity 5.3 req/s per slot.
# The baseline has 4 slots (p90 TTFT <= 150 ms up to ~11 req/s), the better candidate 16 (~76): with 2 and 8
# the baseline's steps sat near 3.4 req/s, where the 16 requests of a step took 5 s and a
# confirmation step 10 s, in its own trial and in every paired round (160 s for the test, 92 s now).
SCENARIOS = """
[slo]
prompt_tokens = 16
output_tokens = 4
num_requests = 32
concurrency = 0
arrival = "poisson"
rate = 8.0
warmup_requests = 1
seed = 8
"""


@pytest.mark.timeout(900)  # rate searches and paired rounds, each redone when the shared host gets busier
def test_an_slo_goal_keeps_the_server_with_the_higher_rate_and_drops_the_one_that_never_meets_it(tmp_path, tiny_model):
    (tmp_path / "target.toml").write_text(TARGET)
    (tmp_path / "scenarios.toml").write_text(SCENARIOS)
    (tmp_path / "steps.json").write_text(json.dumps([{"slots": 16}, {"slots": 1}]))
    ws = Workspace(tmp_path, [f'target="{tmp_path / "target.toml"}"', f'proposer="scripted:{tmp_path / "steps.json"}"',
                              "gates.accuracy=false", "gates.integrity=false", 'bench.scenarios="scenarios.toml"',
                              "bench.baseline_repeats=1",
                              # Coarse, short rate steps: the servers' capacities differ 4x, so a 25% bisection
                              # still tells them apart (a search takes ~10 s here, not 20-40 s).
                              # The rate's confirmation steps (bench.slo_confirmations) stay at the default 4: with 1,
                              # the (then) 8-slot server's one 2x-long step failed in a fresh-clone CI run (a queue
                              # the short steps missed) and the trial scored nothing.
                              "bench.slo_precision=0.25", "bench.slo_min_requests=16", "bench.slo_min_seconds=1.5",
                              # The 1-slot server (service 190 ms, p90 TTFT <= 150 ms) holds the limit only
                              # below ~2 req/s: with 40 s steps its search went on down to 1-1.5 req/s in steps
                              # of 8-32 s (88 s); with 4 s steps no rate under 16 / 4 = 4 req/s is tried and it
                              # scores 0 after two steps (8, 4 req/s): the server that never meets the SLO in the
                              # range searched. The 4-slot baseline's answer (~8 req/s) is well inside the range.
                              "bench.slo_max_step_s=4"])
    goal = parse_goal("maximize throughput with p90 TTFT under 150 ms within 3 trials")
    out = start_run(ws, goal)
    store = Store(ws.db_url)
    # The baseline and the proposer's candidates (sentinels and paired rounds depend on the host's load).
    trials = dict(enumerate(t for t in store.list_trials(out.run_id) if t.proposer not in LOOP_ADDED))
    base, more, fewer = trials[0], trials[1], trials[2]
    rate = {n: t.objective.get("slo:slo_rate") for n, t in trials.items()}
    assert base.status == "kept" and rate[0] > 0, (base.error, rate)
    assert more.status == "kept" and more.score > 2.5, (more.score, rate)  # 4x the slots: a paired ratio of rates
    assert fewer.status != "kept" and (fewer.score or 0) < 1, (fewer.status, fewer.score, rate)
    m = {x.metric: x.value for x in store.measurements(more.id) if x.scenario == "slo"}
    assert m["slo_rate"] == rate[1] and m["ttft_ms_p90"] <= 150 and m["slo_goodput"] > 0
    assert not out.stop_reason.startswith("GoalMet")  # maximize: scored, never "met"
    # Each paired half searched near the rate its knob set reached before (the baseline's, the
    # candidate's, then the previous round's), not from the scenario's 8 req/s.
    halves = [t for t in store.list_trials(out.run_id) if t.proposer == "paired" and t.status == "kept"]
    assert halves, [(t.number, t.proposer, t.status) for t in store.list_trials(out.run_id)]
    for t in halves:
        meta = json.loads((ws.run_dir(out.run_id) / f"trial-{t.number}" / "bench-slo-0.json").read_text())["meta"]
        assert meta["rate_near"] > 0 and meta["rate_search"][0]["rate"] == meta["rate_near"], (t.number, meta["rate_search"])
