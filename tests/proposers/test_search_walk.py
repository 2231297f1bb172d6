"""The walk: after the start-up the search steps the best trial along a numeric knob while that pays.

On the H200 target the covering start-up finds the CUDA-graph engine at batch 3; TPE then proposed
batches 2, 2, 7, 6, 10, 8 (benchmarks/gpu/ttb_replay.py). The walk doubles the batch from the best
trial while each step becomes the new best, hands a step that did not improve back to TPE, and never
proposes a measured knob set, a refused value or a knob set inside a failed region."""

import optuna
import pytest

from orchestrator.proposers.search import WALK_PREFIX, SearchProposer
from orchestrator.store import Store
from orchestrator.targets import load_target
from tests.proposers.test_failed_regions import GPU, OOM

T = load_target(GPU)
FG = {"engine": "fast-graphs", "batching": "on", "kernels": "triton", "prefill_chunk": 0, "sdpa": "auto",
      "prefill_pack": 0, "prefill_attn": "torch"}


@pytest.fixture(autouse=True)
def _quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(tmp_path, rows):
    """A store whose run holds the baseline and `rows` (knobs, status, score, error, rationale) as search trials."""
    store = Store(f"sqlite:///{tmp_path / 'w.db'}")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    t = store.create_trial(run.id, 0, commit="", knobs=T.baseline_knobs(), rationale="", proposer="baseline")
    store.finish_trial(t.id, "kept", score=1.0)
    for knobs, status, score, error, why in rows:
        _add(store, run, knobs, status, score, error, why)
    return store, run


def _add(store, run, knobs, status, score, error=None, why="start-up proposal"):
    n = len(store.list_trials(run.id))
    t = store.create_trial(run.id, n, commit="", knobs=T.validate_knobs(knobs), rationale=why, proposer="search")
    store.finish_trial(t.id, status, score=score, error=error)


START = [  # the covering start-up of seed 0 on the H200 target, scored as the 7B scored them
    (FG | {"max_batch_size": 3}, "kept", 6.6, None, "start-up proposal 1"),
    ({"engine": "fast-eager", "batching": "off", "prefill_chunk": 256, "sdpa": "flash", "prefill_pack": 0,
      "prefill_attn": "torch"}, "discarded", 1.1, None, "start-up proposal 2"),
    ({"engine": "hf-manual", "batching": "on", "max_batch_size": 49}, "discarded", 2.0, None, "start-up proposal 3"),
]


def test_the_walk_doubles_the_best_batch_while_each_step_becomes_the_best(tmp_path):
    store, run = _run(tmp_path, START)
    p = SearchProposer(seed=0, rank=1)  # the walk alone: no cost-model steps between
    c = p.propose(store.list_trials(run.id), T)
    assert c.knobs == T.validate_knobs(FG | {"max_batch_size": 6})
    assert c.rationale == f"{WALK_PREFIX} max_batch_size up from #1 (6.600x, the best so far): 3 -> 6"
    _add(store, run, c.knobs, "kept", 8.3, why=c.rationale)
    c = p.propose(store.list_trials(run.id), T)  # the step became the best: the same way again
    assert c.knobs == T.validate_knobs(FG | {"max_batch_size": 12})
    assert c.rationale.startswith(f"{WALK_PREFIX} max_batch_size up from #4 (8.300x")
    _add(store, run, c.knobs, "discarded", 8.0, why=c.rationale)
    c = p.propose(store.list_trials(run.id), T)  # that step did not improve: TPE's turn
    assert c.rationale.startswith("TPE proposal")
    _add(store, run, c.knobs, "discarded", 1.0, why=c.rationale)
    # a new walk from the best (#4, batch 6): up (12) and down (3) are measured, nothing else is
    # numeric: TPE again, not a repeat
    c = p.propose(store.list_trials(run.id), T)
    assert c.rationale.startswith("TPE proposal")


def test_the_walk_never_steps_into_a_failed_region_and_says_it_skipped(tmp_path):
    # batch 4 ran out of memory: every batch >= 4 of these categoricals is in its region, so the walk
    # from batch 3 does not go up to 6 (recorded as a skip) but down to 2
    rows = START + [(FG | {"max_batch_size": 4}, "failed", None, OOM, "TPE proposal after 4 observed trials")]
    store, run = _run(tmp_path, rows)
    c = SearchProposer(seed=0, rank=1).propose(store.list_trials(run.id), T)
    assert c.knobs == T.validate_knobs(FG | {"max_batch_size": 2})
    assert c.rationale.startswith(f"{WALK_PREFIX} max_batch_size down from #1")
    assert [(s["source"], s["knobs"]["max_batch_size"], s["marked_by"]) for s in c.extra["skipped"]] == [("walk", 6, 4)]


def test_no_walk_in_the_start_up_from_a_best_without_numeric_knobs_when_off_or_for_two_objectives(tmp_path):
    store, run = _run(tmp_path, START[:1])  # the start-up is not done (2 of 4 trials finished)
    assert SearchProposer(seed=0, rank=1).propose(store.list_trials(run.id), T).rationale.startswith("start-up proposal")
    worse = [(k, "discarded", 0.5, None, w) for k, _, _, _, w in START]  # the best is the baseline: nothing numeric
    store, run = _run(tmp_path / "b", worse) if (tmp_path / "b").mkdir() is None else (None, None)
    assert SearchProposer(seed=0, rank=1).propose(store.list_trials(run.id), T).rationale.startswith("TPE proposal")
    store, run = _run(tmp_path / "c", START) if (tmp_path / "c").mkdir() is None else (None, None)
    assert SearchProposer(seed=0, walk=False, rank=1).propose(store.list_trials(run.id), T).rationale.startswith("TPE proposal")
    assert SearchProposer(seed=0, objectives=[object(), object()]).walk is False  # a Pareto search has no single best
