"""The region a prior supports (`prior_region`): a value the source run measured inside its good
region and lost is ruled out; a value it never measured there stays open. While the prior holds,
the search proposes inside the region; when the region is used up, or the prior stops holding,
it searches the whole space."""


import kb_table as T  # noqa: E402
import optuna

from orchestrator.proposers.priors import prior_region, prior_weight
from orchestrator.proposers.search import SearchProposer
from orchestrator.store import Store

TARGET = T.grid_target()
BASE = TARGET.baseline_knobs()  # float32, generate, batching off, batch 8, dynamic, eager, threads 0


def _obs(score, **kw):
    return {"knobs": BASE | kw, "score": score, "weight": 0.6, "entry": "finding-a"}


# A source run shaped like model A's: batching decides; bfloat16 won; sdpa was only ever measured
# with small batches (where everything is slow), never with the large batches that won.
SOURCE = [
    _obs(1.0), _obs(1.1, attn="sdpa"), _obs(1.2, decode_loop="manual"), _obs(1.3, dtype="bfloat16"),
    _obs(3.2, batching="on", max_batch_size=32, dtype="bfloat16", threads=1),
    _obs(3.1, batching="on", max_batch_size=8, dtype="bfloat16", threads=2),
    _obs(1.4, batching="on", max_batch_size=1, dtype="bfloat16", threads=1),
    _obs(1.6, batching="on", max_batch_size=2, dtype="bfloat16", attn="sdpa"),
    _obs(2.7, batching="on", max_batch_size=4, dtype="bfloat16", attn="sdpa"),
    _obs(0.4, batching="on", max_batch_size=32, dtype="float32"),
]


def _in(region, knobs):
    return all(knobs[k] in v if isinstance(v, list) else v[0] <= knobs[k] <= v[1] for k, v in region.items())


def test_what_lost_inside_the_region_is_ruled_out_and_what_was_never_tried_there_stays_open():
    r = prior_region(SOURCE, TARGET)
    assert r["batching"] == ["on"] and r["dtype"] == ["bfloat16"]
    assert r["max_batch_size"] == [8, 16, 32]  # 1, 2 and 4 lost with batching on; 16 was never tried: open
    # sdpa lost only beside small batches, outside the region: no evidence against it there
    assert r["attn"] == ["eager", "sdpa"]
    assert r["threads"] == [0, 1, 2] and r["decode_loop"] == ["generate", "manual"]
    # judged over all observations instead, sdpa would be condemned by its small-batch results
    assert not any(o["score"] >= 3.2 * 0.9 for o in SOURCE if o["knobs"]["attn"] == "sdpa")


def test_no_region_from_too_little_evidence_and_a_knob_whose_top_differs_between_sources_stays_open():
    assert prior_region(SOURCE[:2], TARGET) == {}
    other = [dict(o, entry="finding-b", knobs=o["knobs"] | {"dtype": "float32"}) for o in SOURCE if o["knobs"]["dtype"] == "bfloat16"]
    joined = prior_region(SOURCE + other, TARGET)
    assert joined["dtype"] == ["float32", "bfloat16"] and joined["batching"] == ["on"]


# A second source model: batching and large batches won there too, with float32 and 2 threads; it
# measured 0 and 1 threads and bfloat16 beside its winner, and they lost.
WIN_B = BASE | {"batching": "on", "max_batch_size": 32, "threads": 2}
SOURCE_B = [dict(o, entry="finding-b", weight=0.55) for o in [
    _obs(1.0), _obs(3.0, **WIN_B), _obs(2.9, **WIN_B | {"max_batch_size": 16}), _obs(1.5, **WIN_B | {"max_batch_size": 2}),
    _obs(1.9, **WIN_B | {"threads": 1}), _obs(1.8, **WIN_B | {"threads": 0}), _obs(2.0, **WIN_B | {"dtype": "bfloat16"})]]


def test_two_sources_narrow_where_they_agree_and_open_where_their_tops_differ():
    alone = prior_region(SOURCE, TARGET)
    assert alone["threads"] == [0, 1, 2]  # model A's run never measured threads inside its region: open
    joined = prior_region(SOURCE + SOURCE_B, TARGET)
    # threads: the second source ruled 0 out, and no source's top used it; 1 stays (A's winner used it)
    assert joined["threads"] == [1, 2]
    # the sources' winners disagree on dtype (bfloat16 on A, float32 on the other): both stay open
    assert joined["dtype"] == ["float32", "bfloat16"]
    # batch: both agree on large batches; 2 lost on the other source and was never top
    assert joined["batching"] == ["on"] and joined["max_batch_size"] == [8, 16, 32]
    # one source's region equals its own narrowing (its tops are inside what it allows)
    assert prior_region(SOURCE_B, TARGET)["threads"] == [2]


def test_two_agreeing_sources_hold_longer_than_one():
    assert prior_weight(SOURCE) == 0.6 and prior_weight(SOURCE_B) == 0.55
    assert abs(prior_weight(SOURCE + SOURCE_B) - (1 - 0.4 * 0.45)) < 1e-9
    store = Store("sqlite://")
    hist = _run(store, [(WIN_B, 0), (SOURCE[4]["knobs"], 3.0), (SOURCE[5]["knobs"], 3.1), (WIN_B | {"threads": 1}, 2.0)],
                warm_score=3.0)  # 4 scored trials of its own
    assert not SearchProposer(priors=SOURCE)._priors_hold(hist)  # horizon 6 x 0.6 = 4 trials
    assert SearchProposer(priors=SOURCE + SOURCE_B)._priors_hold(hist)  # horizon 6 x 0.82 = 5 trials


def _run(store, knobs_scores, warm_score):
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    t = store.create_trial(run.id, 0, commit="", knobs=BASE, rationale="baseline", proposer="baseline")
    store.finish_trial(t.id, "kept", score=1.0)
    for n, (k, s) in enumerate(knobs_scores, 1):
        t = store.create_trial(run.id, n, commit="", knobs=k, rationale="warm start: a prior best" if n == 1 else "TPE",
                               proposer="search")
        store.finish_trial(t.id, "kept" if s > 1 else "discarded", score=s if n > 1 else warm_score)
    return store.list_trials(run.id)


def test_the_proposer_searches_the_region_while_the_prior_holds_then_the_whole_space():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    region = prior_region(SOURCE, TARGET)
    winner = SOURCE[4]["knobs"]
    store = Store("sqlite://")
    holding = _run(store, [(winner, 0)], warm_score=2.5)  # the transferred winner won here too
    inside = [SearchProposer(seed=s, priors=SOURCE).propose(holding, TARGET) for s in range(8)]
    assert all(_in(region, c.knobs) for c in inside), [c.knobs for c in inside if not _in(region, c.knobs)]
    assert all("inside the region" in c.rationale for c in inside)
    # without a prior the same seeds leave that region (it is 72 of 576 knob sets)
    plain = [SearchProposer(seed=s).propose(holding, TARGET) for s in range(8)]
    assert not all(_in(region, c.knobs) for c in plain)
    lost = _run(store, [(winner, 0)], warm_score=0.7)  # it lost here: the prior no longer holds
    after = [SearchProposer(seed=s, priors=SOURCE).propose(lost, TARGET) for s in range(8)]
    assert not any("inside the region" in c.rationale for c in after)


def test_a_used_up_region_falls_back_to_the_whole_space():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # A source that pinned every knob but kv_cache: each other value was measured beside its winner and lost.
    win = BASE | {"batching": "on", "max_batch_size": 32, "dtype": "bfloat16", "threads": 1}
    source = [_obs(3.0, **win), _obs(2.9, **win | {"kv_cache": "static"})]
    source += [_obs(1.0, **win | {k: v}) for k in win if k != "kv_cache" for v in
               sorted({g[k] for g in T.knob_grid(TARGET)}, key=repr) if v != win[k]]
    region = prior_region(source, TARGET)
    inside = [k for k in T.knob_grid(TARGET) if _in(region, k)]
    assert len(inside) == 2
    store = Store("sqlite://")
    hist = _run(store, [(inside[0], 0), (inside[1], 2.9)], warm_score=3.0)
    p = SearchProposer(seed=0, priors=source)
    assert p._priors_hold(hist)  # the prior still holds, but its region is measured out
    c = p.propose(hist, TARGET)
    assert c is not None and not _in(region, c.knobs) and "inside the region" not in c.rationale


def test_a_region_that_misses_this_runs_space_leaves_that_knob_alone():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pinned = T.grid_target(fixed={"dtype": "float32"})  # this run cannot use the source's bfloat16
    store = Store("sqlite://")
    hist = _run(store, [(BASE | {"batching": "on", "max_batch_size": 32, "threads": 1}, 0)], warm_score=2.0)
    for s in range(4):
        c = SearchProposer(seed=s, priors=SOURCE).propose(hist, pinned)
        assert c.knobs["dtype"] == "float32" and c.knobs["batching"] == "on" and c.knobs["max_batch_size"] >= 8
