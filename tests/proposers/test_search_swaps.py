"""Probes and swaps: a run's winner's one-knob neighbours (`neighbours`, measured after the stop as
`probe` trials) say which knobs moved it; on the next model, with two or more source runs, the
search tries one-knob swaps between the source winners (`swaps`), the knobs that mattered first.
The probes never enter the TPE prior or the region."""


import kb_table as T  # noqa: E402

from orchestrator.proposers.optspace import neighbours
from orchestrator.proposers.priors import prior_weight, swaps
from orchestrator.proposers.search import SearchProposer
from orchestrator.store import Store
from orchestrator.targets import load_target

GRID = T.grid_target()  # max_batch_size categorical on 1..32
B = GRID.baseline_knobs()
SHIPPED = load_target(T.TARGET)  # max_batch_size an int knob on a log scale


def test_neighbours_change_one_knob_each_every_other_choice_or_the_adjacent_sizes_of_a_numeric_knob():
    got = neighbours(GRID, B | {"max_batch_size": 8})
    assert all(sum(k[n] != B[n] for n in B if n != "max_batch_size") + (k["max_batch_size"] != 8) == 1 for _, _, k in got)
    by = {}
    for name, value, _ in got:
        by.setdefault(name, []).append(value)
    assert by["max_batch_size"] == [1, 2, 4, 16, 32]  # a categorical knob: its choices are unordered
    assert by["dtype"] == ["bfloat16"] and by["attn"] == ["sdpa"] and by["threads"] == [1, 2]  # 0 is "all cores"
    assert [n for n, _, _ in got] == [n for n in GRID.knobs for _ in by.get(n, [])]  # the target's order
    # an int knob on a log scale: x2 and /2, clamped to its range
    on = SHIPPED.validate_knobs({"batching": "on"})
    ints = {v for n, v, _ in neighbours(SHIPPED, on | {"max_batch_size": 32}) if n == "max_batch_size"}
    assert ints == {16}
    ints = {v for n, v, _ in neighbours(SHIPPED, on) if n == "max_batch_size"}
    assert ints == {4, 16}
    # batching off: the batch size does not exist (`when`), so it has no neighbours
    assert not any(n == "max_batch_size" for n, _, _ in neighbours(SHIPPED, SHIPPED.baseline_knobs()))


def _obs(entry, knobs, score, probe=False):
    return {"knobs": knobs, "score": score, "weight": 0.5, "entry": entry} | ({"probe": True} if probe else {})


WA = B | {"dtype": "float32", "attn": "sdpa", "kv_cache": "static", "batching": "on", "max_batch_size": 32}
WC = B | {"dtype": "bfloat16", "attn": "eager", "kv_cache": "dynamic", "batching": "on", "max_batch_size": 32}
# Two source runs whose winners differ on dtype, attn and kv_cache. The probes say: attn moved A's
# winner by 25%, dtype moved C's by 10%, kv_cache moved nothing.
PRIORS = [_obs("a", WA, 4.0), _obs("a", B, 1.0), _obs("a", B | {"batching": "on"}, 2.0),
          _obs("a", WA | {"attn": "eager"}, 3.0, probe=True), _obs("a", WA | {"kv_cache": "dynamic"}, 4.0, probe=True),
          _obs("c", WC, 4.0), _obs("c", B, 1.0), _obs("c", B | {"batching": "on"}, 2.2),
          _obs("c", WC | {"dtype": "float32"}, 3.6, probe=True)]


def _history(store, warm):
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    for i, (k, s) in enumerate([(B, 1.0), *warm]):
        t = store.create_trial(run.id, i, commit="", knobs=k, rationale="warm start: prior" if i else "baseline",
                               proposer="search")
        store.finish_trial(t.id, "kept", score=s)
    return run, store.list_trials(run.id)


def test_swaps_start_from_the_winner_that_scored_best_here_and_skip_knobs_that_moved_nothing():
    _, hist = _history(Store("sqlite://"), [(WC, 4.4), (WA, 3.0)])
    assert [k for k, _ in swaps(PRIORS, hist)] == [WC | {"attn": "sdpa"}, WC | {"dtype": "float32"}]
    _, hist = _history(Store("sqlite://"), [(WC, 2.0), (WA, 3.0)])  # A's winner did better here: swaps start from it
    assert [k for k, _ in swaps(PRIORS, hist)] == [WA | {"attn": "eager"}, WA | {"dtype": "bfloat16"}]
    assert swaps([p for p in PRIORS if p["entry"] == "a"], hist) == []  # one source: nothing to swap between


def test_a_probe_that_ties_with_a_winner_does_not_replace_it():
    """A probe that moved nothing (threads 0 -> 2) scores what the winner scored; the winner is the
    one the source marked, so the swaps still start from the winners and change what mattered."""
    tie = [_obs("c", WC | {"threads": 2}, 4.0, probe=True), {**_obs("c", WC, 4.0, probe=True), "winner": True}]
    _, hist = _history(Store("sqlite://"), [(WC, 4.4), (WA, 3.0)])
    priors = tie + [p for p in PRIORS if not (p["entry"] == "c" and p["knobs"] == WC)]
    assert [k for k, _ in swaps(priors, hist)] == [WC | {"attn": "sdpa"}, WC | {"dtype": "float32"}]
    untagged = [dict(p) for p in priors]
    for p in untagged:
        p.pop("winner", None)
    assert [k for k, _ in swaps(untagged, hist)] != [WC | {"attn": "sdpa"}, WC | {"dtype": "float32"}]  # what the tag prevents


def test_the_proposer_tries_the_swaps_after_the_warm_starts_and_keeps_the_probes_out_of_its_model():
    store = Store("sqlite://")
    run, hist = _history(store, [(WC, 4.4), (WA, 3.0)])
    p = SearchProposer(seed=0, warm_start=[WC, WA], priors=PRIORS)
    assert len(p.probes) == 3 and all(not o.get("probe") for o in p.priors)
    assert prior_weight(p.priors) == prior_weight([o for o in PRIORS if not o.get("probe")])
    assert not any(t.params == {k: v for k, v in o["knobs"].items()} for t in p._prior_trials(hist, GRID, _dists())
                   for o in PRIORS if o.get("probe"))
    first = p.propose(hist, GRID)
    assert first.knobs == WC | {"attn": "sdpa"} and first.rationale.startswith("swap")
    t = store.create_trial(run.id, 3, commit="", knobs=first.knobs, rationale=first.rationale, proposer="search")
    store.finish_trial(t.id, "discarded", score=3.9)
    assert p.propose(store.list_trials(run.id), GRID).knobs == WC | {"dtype": "float32"}
    # without probes nothing says which knob matters: no swaps, the priors' search as before
    plain = SearchProposer(seed=0, warm_start=[WC, WA], priors=[o for o in PRIORS if not o.get("probe")])
    assert not plain.propose(hist, GRID).rationale.startswith("swap")


def test_swaps_stop_once_the_priors_stop_holding():
    """A transferred winner that loses to the baseline here ends the priors, and the swaps with them."""
    _, hist = _history(Store("sqlite://"), [(WC, 4.4), (WA, 0.8)])
    cand = SearchProposer(seed=0, warm_start=[WC, WA], priors=PRIORS).propose(hist, GRID)
    assert not cand.rationale.startswith("swap")


def _dists():
    from orchestrator.proposers.optspace import distributions

    return distributions(GRID)


def test_the_swaps_do_not_use_up_the_trials_the_priors_hold_for():
    """The priors hold for PRIOR_HORIZON x weight of the run's own scored trials; a swap is an extra
    trial, not one of them, so the region still gets its trials after the swaps."""
    from orchestrator.proposers.priors import PRIOR_HORIZON

    store = Store("sqlite://")
    run, hist = _history(store, [(WC, 4.4), (WA, 3.0)])
    p = SearchProposer(seed=0, warm_start=[WC, WA], priors=PRIORS)
    horizon = round(PRIOR_HORIZON * prior_weight(p.priors))
    assert horizon == 4  # two sources of weight 0.5: 6 x 0.75
    n = 3
    for knobs, why in swaps(PRIORS, hist):
        t = store.create_trial(run.id, n, commit="", knobs=knobs, rationale=why, proposer="search")
        store.finish_trial(t.id, "discarded", score=2.0)
        n += 1
    own = [B | {"threads": 1}]  # with the two warm starts: 3 own trials (and 2 swaps)
    for knobs in own:
        t = store.create_trial(run.id, n, commit="", knobs=knobs, rationale="TPE proposal", proposer="search")
        store.finish_trial(t.id, "discarded", score=1.5)
        n += 1
    assert p._priors_hold(store.list_trials(run.id))
    t = store.create_trial(run.id, n, commit="", knobs=B | {"attn": "sdpa"}, rationale="TPE proposal", proposer="search")
    store.finish_trial(t.id, "discarded", score=1.5)
    assert not p._priors_hold(store.list_trials(run.id))  # the fourth own trial ends them
