"""The model step moves a numeric knob as far as the fitted slope says pays, and the walk gives way to the cost model:
it skips a step the model predicts a loss for, and steps where the model has nothing to say."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from orchestrator.proposers.costmodel import CostModel
from orchestrator.proposers.modelstep import MODEL_PREFIX, ladder, walk_loses
from orchestrator.proposers.search import WALK_PREFIX, SearchProposer
from orchestrator.store import Store
from orchestrator.targets import load_target
from tests.proposers.test_failed_regions import OOM

GPU = load_target(Path(__file__).resolve().parents[2] / "examples" / "targets" / "hfserve_gpu.toml")
FG = {"engine": "fast-graphs", "batching": "on"}


@pytest.fixture(autouse=True)
def _quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(rows, error=None):
    """The stored trials of a run: the baseline, then `rows` (knobs, status, score); a failed one failed with `error`."""
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    for i, (knobs, status, score) in enumerate([({}, "kept", 1.0), *rows]):
        t = store.create_trial(run.id, i, commit="", knobs=GPU.validate_knobs(knobs), rationale="start-up proposal",
                               proposer="baseline" if i == 0 else "search")
        store.finish_trial(t.id, status, score=score, error=error if status == "failed" else None)
    return store.list_trials(run.id)


START = [(FG | {"max_batch_size": 8}, "kept", 6.0), (FG | {"engine": "fast-eager"}, "discarded", 2.0),
         ({"engine": "hf-manual"}, "discarded", 0.9)]


def test_the_ladder_holds_every_doubling_and_halving_within_the_range_and_its_ends():
    batch = GPU.knobs["max_batch_size"]  # int, 2..64, log
    assert ladder(batch, 8) == [2, 4, 16, 32, 64]
    assert ladder(batch, 3) == [2, 6, 12, 24, 48, 64]  # 64: the range's end, not a doubling of 3
    assert ladder(batch, 64) == [2, 4, 8, 16, 32]


def test_the_model_step_moves_the_batch_as_far_as_the_fitted_slope_says_pays():
    # the prior's slope (x1.18 per doubling) and nothing measured against it: batch 8 -> 64 in one step, not 8 -> 16
    # (one untried level per step: the batch alone moves)
    c = SearchProposer(seed=0, max_untried=1).propose(_run(START), GPU)
    assert c.rationale.startswith(MODEL_PREFIX) and c.knobs == GPU.validate_knobs(FG | {"max_batch_size": 64}), c
    # batch 32 ran out of memory: the failed region it marks holds every larger batch, so the ladder stops at 16
    c = SearchProposer(seed=0, max_untried=1).propose(_run(START + [(FG | {"max_batch_size": 32}, "failed", None)], error=OOM), GPU)
    assert c.rationale.startswith(MODEL_PREFIX) and c.knobs == GPU.validate_knobs(FG | {"max_batch_size": 16}), c


def test_walk_loses_where_the_model_predicts_the_step_under_its_source():
    m = CostModel(GPU, [])  # the prior: larger batches pay
    b32, b64 = GPU.validate_knobs(FG | {"max_batch_size": 32}), GPU.validate_knobs(FG | {"max_batch_size": 64})
    assert walk_loses(m, b64, b32) and not walk_loses(m, b32, b64)


def test_the_walk_skips_a_step_down_the_model_predicts_a_loss_for_and_takes_it_without_the_model():
    # the best is batch 64, the top of the range: the walk's only step is down to 32
    rows = [(FG | {"max_batch_size": 16}, "kept", 6.0), (FG | {"engine": "fast-eager"}, "discarded", 2.0),
            ({"engine": "hf-manual"}, "discarded", 0.9), (FG | {"max_batch_size": 64}, "kept", 8.0)]
    history = _run(rows)
    c = SearchProposer(seed=0, rank=1).propose(history, GPU)  # no cost model: the walk steps down
    assert c.rationale.startswith(f"{WALK_PREFIX} max_batch_size down from #4") and c.knobs["max_batch_size"] == 32
    c = SearchProposer(seed=0).propose(history, GPU)  # the model predicts 32 under 64: no walk step there
    assert not c.rationale.startswith(WALK_PREFIX) and c.knobs.get("max_batch_size") != 32, c


def test_the_model_step_takes_the_move_worth_most_not_the_first_knob_that_gains():
    # from #4 (batch 56) with one untried level allowed: batch 64 (declared before kernels) gains ~3% on the prior's
    # slope, kernels=triton-mm ~7%: the step takes triton-mm, and the batch stays
    rows = START + [(FG | {"max_batch_size": 56}, "kept", 7.0)]
    c = SearchProposer(seed=0, max_untried=1).propose(_run(rows), GPU)
    assert c.rationale.startswith(MODEL_PREFIX) and c.knobs["kernels"] == "triton-mm", c.rationale
    assert c.knobs["max_batch_size"] == 56


def test_the_first_search_trial_is_the_priors_best_guess_from_the_baseline(tmp_path):
    from fake_target import write_fake_target

    # the baseline alone measured: the model step proposes what the target's prior predicts best, within the cap
    # on untried levels (the engine, batching, the batch: three), not a random covering draw
    c = SearchProposer(seed=0).propose(_run([]), GPU)
    assert c.rationale.startswith(f"{MODEL_PREFIX} #0"), c.rationale
    assert (c.knobs["engine"], c.knobs["batching"], c.knobs["max_batch_size"]) == ("fast-graphs", "on", 64)
    # a target without priors: the model predicts no gain from the baseline alone, the start-up proposes
    t = load_target(write_fake_target(tmp_path / "f.toml", choices=(8.0, 6.0, 4.0)))
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    b = store.create_trial(run.id, 0, commit="", knobs=t.baseline_knobs(), rationale="", proposer="baseline")
    store.finish_trial(b.id, "kept", score=1.0)
    c = SearchProposer(seed=0).propose(store.list_trials(run.id), t)
    assert c.rationale.startswith("start-up proposal"), c.rationale
