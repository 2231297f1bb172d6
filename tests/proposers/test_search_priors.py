"""The search proposer's prior: a similar run's measurements steer TPE until they stop fitting."""

import statistics

import kb_table as T  # noqa: E402
import optuna

from orchestrator.proposers.optspace import distributions
from orchestrator.proposers.priors import PRIOR_HORIZON
from orchestrator.proposers.search import SearchProposer
from orchestrator.store import Store

TARGET = T.grid_target()


def _score(k):
    good = k["batching"] == "on" and k["max_batch_size"] >= 8 and k["dtype"] == "float32"
    return (3.0 if good else 1.2 if k["batching"] == "on" else 0.8) * (1.2 if k["attn"] == "sdpa" else 1.0)


def _history(store, knobs_list, rationale="TPE proposal"):
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs=TARGET.baseline_knobs(), rationale="", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0)
    for n, k in enumerate(knobs_list, 1):
        t = store.create_trial(run.id, n, commit="", knobs=k, rationale=rationale if n == 1 else "TPE proposal", proposer="search")
        store.finish_trial(t.id, "kept", score=_score(k))
    return store.list_trials(run.id)


def _priors(n=40, seed=0, weight=0.7):
    """A run on a similar setting that sampled the space and measured it."""
    import random

    grid = T.knob_grid(TARGET)
    return [{"knobs": k, "score": _score(k), "weight": weight} for k in random.Random(seed).sample(grid, n)]


def test_priors_steer_the_first_proposals_towards_what_won_before():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = Store("sqlite://")
    hist = _history(store, [])
    with_p = [_score(SearchProposer(seed=s, priors=_priors(seed=s)).propose(hist, TARGET).knobs) for s in range(12)]
    without = [_score(SearchProposer(seed=s).propose(hist, TARGET).knobs) for s in range(12)]
    assert statistics.mean(with_p) > statistics.mean(without) + 0.5


def test_priors_are_dropped_once_the_transferred_winner_loses_or_the_run_has_its_own_evidence():
    store = Store("sqlite://")
    good = TARGET.baseline_knobs() | {"batching": "on", "max_batch_size": 16}
    bad = TARGET.baseline_knobs() | {"dtype": "bfloat16"}
    p = SearchProposer(priors=_priors(weight=1.0))
    dists = distributions(TARGET)
    assert len(p._prior_trials(_history(store, [good], "warm start: a prior best"), TARGET, dists)) == 40
    assert p._prior_trials(_history(store, [bad], "warm start: a prior best"), TARGET, dists) == []  # lost here (0.8x)
    own = [TARGET.baseline_knobs() | {"max_batch_size": m, "attn": a} for m in T.BATCH_GRID for a in ("eager", "sdpa")]
    assert len(p._prior_trials(_history(store, own[:PRIOR_HORIZON - 1]), TARGET, dists)) == 40
    assert p._prior_trials(_history(store, own[:PRIOR_HORIZON]), TARGET, dists) == []


def test_a_warm_start_names_the_knowledge_base_entry_it_took_its_knobs_from():
    knobs = dict(TARGET.baseline_knobs())
    name, spec = next(iter(TARGET.knobs.items()))
    knobs[name] = next(v for v in (spec.choices or [spec.high, spec.low]) if v != knobs[name])
    c = SearchProposer(warm_start=[knobs], warm_from=["finding-hfserve-0123456789"]).propose([], TARGET)
    assert c.knobs == TARGET.validate_knobs(knobs)
    assert c.rationale == "warm start: the best knob set of knowledge-base entry finding-hfserve-0123456789"
    plain = SearchProposer(warm_start=[knobs]).propose([], TARGET)  # provenance unknown: said so plainly
    assert plain.rationale == "warm start: a prior best from the knowledge base"


def test_a_prior_written_with_every_knob_active_counts_as_its_active_part():
    """A knowledge base written before some knobs became conditional (`when`) still steers the search:
    each prior knob set counts as the knobs active under it (the server ignored the others)."""
    flat = [k for k in T.knob_grid(TARGET) if k["batching"] == "on" and k["max_batch_size"] >= 2][:5]
    assert all("decode_loop" in k and "kv_cache" in k for k in flat)
    cond = T.grid_target(conditional=True)
    p = SearchProposer(priors=[{"knobs": k, "score": _score(k), "weight": 1.0} for k in flat])
    trials = p._prior_trials(_history(Store("sqlite://"), []), cond, distributions(cond))
    assert len(trials) == 5 and all("decode_loop" not in t.params and "kv_cache" not in t.params for t in trials)
    assert {t.params["max_batch_size"] for t in trials} == {k["max_batch_size"] for k in flat}
