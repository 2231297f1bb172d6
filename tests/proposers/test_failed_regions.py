"""Failures learned: an out-of-memory trial marks its knob region, a deterministic start-up crash
its exact knob set; timeouts and host errors mark nothing. The real SearchProposer over trials in a
real store never proposes inside a region again, skips warm starts there, and says so."""

import itertools
import warnings
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from orchestrator.core.candidate import knob_key
from orchestrator.loop.controller import Controller
from orchestrator.proposers.optspace import REGION_CONSTRAINT, distributions
from orchestrator.proposers.search import SearchProposer
from orchestrator.review.why import explain_run, explain_trial
from orchestrator.store import Store
from orchestrator.targets import load_target
from orchestrator.targets.base import Knob
from orchestrator.targets.regions import failed_regions, memory_direction, region_containing, region_of
from orchestrator.targets.space import active_only
from orchestrator.trial import verdict

GPU = Path(__file__).resolve().parents[2] / "examples" / "targets" / "hfserve_gpu.toml"
OOM = ("start-up failure (out_of_memory): torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
       "[ServerCrashed: server exited before it became healthy]")
CRASH = "start-up failure (crash): Segmentation fault (core dumped) [ServerCrashed: server exited before it became healthy]"
# The failing knob set: the fast engine with graphs, batching on, 16 slots, 1024-token chunks.
K = {"engine": "fast-graphs", "batching": "on", "max_batch_size": 16, "prefill_chunk": 1024, "sdpa": "auto",
     "kernels": "torch", "prefill_pack": 0, "prefill_attn": "torch", "prefill_rounds": 1, "overlap_schedule": "off", "gc_freeze": "off"}


@pytest.fixture(autouse=True)
def _quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def small_target(engine=None):
    """hfserve_gpu with a small space: batch sizes 2..32 in powers of two (still `memory = "up"`), sdpa,
    the decode kernels and the prefill steps pinned; `engine` pins the engine too (18 knob sets in all)."""
    t = load_target(GPU)
    knobs = dict(t.knobs)
    knobs["max_batch_size"] = knobs["max_batch_size"].model_copy(
        update={"type": "categorical", "choices": (2, 4, 8, 16, 32), "low": None, "high": None, "log": False})
    knobs["sdpa"] = knobs["sdpa"].model_copy(update={"choices": ("auto",)})
    knobs["kernels"] = knobs["kernels"].model_copy(update={"choices": ("torch",)})
    for name in ("prefill_pack", "prefill_attn", "prefill_rounds", "overlap_schedule", "gc_freeze"):  # pinned, like sdpa
        knobs[name] = knobs[name].model_copy(update={"choices": (knobs[name].default,)})
    if engine:
        knobs["engine"] = knobs["engine"].model_copy(update={"choices": (engine,), "default": engine})
    return t.model_copy(update={"knobs": knobs})


def every_knob_set(target):
    sets = (active_only(target, dict(zip(target.knobs, v, strict=True)))
            for v in itertools.product(*(target.knobs[n].choices for n in target.knobs)))
    return {knob_key(k): k for k in sets}


def _store_history(store, target, rows, run=None):
    """Trials stored like a run stores them: (knobs, status, score, error)."""
    goal = {"objectives": [{"metric": "throughput", "value": 1.5}]}
    run = run or store.create_run("r", "throughput 1.5x", goal, "h", {}, {}, "local", "search")
    n = len(store.list_trials(run.id))
    for i, (knobs, status, score, error) in enumerate(rows, n):
        t = store.create_trial(run.id, i, commit="", knobs=target.validate_knobs(knobs), rationale="",
                               proposer="baseline" if i == 0 else "search")
        store.finish_trial(t.id, status, score=score, error=error)
    return run, store.list_trials(run.id)


def test_the_target_declares_which_knobs_raise_memory_and_old_files_still_load():
    t = load_target(GPU)
    assert t.knobs["max_batch_size"].memory == "up"
    assert memory_direction("prefill_chunk", t.knobs["prefill_chunk"]) == [256, 1024, 0]
    assert memory_direction("engine", t.knobs["engine"]) is None
    # no attribute: guessed from the name for numeric knobs; `none` overrides the guess
    assert memory_direction("max_num_seqs", Knob(type="int", low=1, high=256, default=8)) == "up"
    assert memory_direction("threads", Knob(type="int", low=0, high=8, default=0)) is None
    assert memory_direction("max_model_len", Knob(type="int", low=1, high=9, default=2, memory="none")) is None
    with pytest.raises(ValueError, match="memory"):
        Knob(type="categorical", choices=(0, 256), default=0, memory=[0, 512])
    assert load_target(GPU.with_name("hfserve.toml")).knobs  # a target file without `memory` anywhere


def test_an_oom_marks_larger_batches_at_the_same_categoricals_a_crash_only_its_own_set():
    t = load_target(GPU)
    oom = region_of(t, 3, K, "failed", OOM)
    assert oom.kind == "out_of_memory" and oom.trial == 3
    assert oom.contains(K) and oom.contains(K | {"max_batch_size": 32}) and oom.contains(K | {"prefill_chunk": 0})
    assert not oom.contains(K | {"max_batch_size": 8})  # a smaller batch may still fit
    assert not oom.contains(K | {"prefill_chunk": 256})  # smaller chunks need less
    assert not oom.contains(K | {"engine": "fast-eager"}) and not oom.contains(K | {"sdpa": "flash"})
    assert "max_batch_size>=16" in oom.describe() and "engine='fast-graphs'" in oom.describe()

    crash = region_of(t, 4, K, "failed", CRASH)
    assert crash.kind == "crash" and crash.contains(K)
    assert not crash.contains(K | {"max_batch_size": 32}) and not crash.contains(K | {"max_batch_size": 8})
    assert not crash.contains({k: v for k, v in K.items() if k != "sdpa"})
    # an OOM during the bench (the server answered 500s) marks the region too
    assert region_of(t, 5, K, "failed", "4 of 8 requests failed in decode (500: CUDA out of memory)").kind == "out_of_memory"
    assert region_of(t, 5, K, "failed", "start-up failure (crash): Killed [oom-kill by the kernel]").kind == "out_of_memory"


@pytest.mark.parametrize("status, error", [
    ("failed", "start-up failure (timeout): loading weights [ServerTimeout: not healthy after 300 s]"),
    ("failed", "start-up failure (timeout): CUDA out of memory while warming up [ServerTimeout: ...]"),
    ("failed", "start-up failure (port_in_use): Address already in use [ServerCrashed: ...]"),
    ("failed", "HostError: ssh: connection reset"),
    ("failed", "the server died during the benchmark"),
    ("failed", "start-up failure (constraint_violated, not launched): max_batch_size > 8 needs batching"),
    ("invalid", "accuracy gate: out of memory"),
    ("discarded", None),
])
def test_timeouts_host_errors_and_gate_verdicts_mark_nothing(status, error):
    assert region_of(load_target(GPU), 2, K, status, error) is None


@pytest.mark.parametrize("engine, seed", [("fast-graphs", 3), ("fast-graphs", 11), (None, 3)])
def test_the_oom_region_is_never_proposed_over_a_whole_search(engine, seed):
    target, store = small_target(engine), Store("sqlite://")
    run, history = _store_history(store, target, [({}, "kept", 1.0, None), (K, "failed", None, OOM)])
    [region] = failed_regions(target, history)
    proposer, proposed, skipped = SearchProposer(seed=seed, n_startup=3), [], []
    for _ in range(60):  # more asks than the space has knob sets: the search runs until it has nothing left
        c = proposer.propose(history, target)
        if c is None:
            break
        assert not region.contains(c.knobs), f"proposed {c.knobs} inside {region.describe()}"
        proposed.append(c.knobs)
        skipped += c.extra.get("skipped", [])
        _, history = _store_history(store, target, [(c.knobs, "discarded", 0.9, None)], run)
    # the search ran until it had nothing left (or 60 asks), never twice the same set
    assert len({knob_key(k) for k in proposed}) == len(proposed) >= 8
    # every skip names the region and the trial that marked it
    assert skipped and all(s["marked_by"] == 1 and s["region"]["kind"] == "out_of_memory" for s in skipped)
    assert all(region.contains(s["knobs"]) for s in skipped)
    # the region's categoricals with a smaller batch stay open: the search went there
    same = [k for k in proposed if all(k.get(n) == K[n] for n in ("engine", "batching")) and k["prefill_chunk"] in (1024, 0)]
    assert any(k["max_batch_size"] < 16 for k in same) and all(k["max_batch_size"] < 16 for k in same)
    outside = {k for k, v in every_knob_set(target).items() if not region.contains(v)}
    assert {knob_key(k) for k in proposed} <= outside


def test_tpe_sees_the_region_as_infeasible_and_warm_starts_inside_it_are_skipped():
    target, store = small_target(), Store("sqlite://")
    _, history = _store_history(store, target, [({}, "kept", 1.0, None), (K, "failed", None, OOM)])
    bigger, smaller = K | {"max_batch_size": 32}, K | {"max_batch_size": 8}
    c = SearchProposer(warm_start=[bigger, smaller]).propose(history, target)
    assert c.knobs == smaller and c.rationale.startswith("warm start")
    [skip] = c.extra["skipped"]
    assert skip["knobs"] == bigger and skip["source"] == "warm start" and skip["marked_by"] == 1
    # the constraint-aware TPE: the failed trial enters the study as infeasible, with its region
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecated Optuna API (constraints_func) on the way
        frozen = optuna.trial.create_trial(params={"x": 1}, distributions={"x": optuna.distributions.IntDistribution(0, 2)},
                                           value=0.0, constraints={REGION_CONSTRAINT: 1.0})
    assert frozen.constraints == {REGION_CONSTRAINT: 1.0}
    # priors (the knowledge base) inside the region do not enter the model
    p = SearchProposer(priors=[{"knobs": bigger, "score": 3.0, "weight": 0.9, "entry": "a"}])
    dists = distributions(target)
    assert p._prior_trials(history, target, dists, failed_regions(target, history)) == []


def test_a_crash_marks_only_its_combination_and_a_timeout_nothing():
    target, store = small_target(), Store("sqlite://")
    timeout = "start-up failure (timeout): still loading [ServerTimeout: not healthy after 300 s]"
    other = K | {"engine": "fast-eager"}
    _, history = _store_history(store, target, [({}, "kept", 1.0, None), (K, "failed", None, CRASH),
                                                (other, "failed", None, timeout)])
    [crash] = failed_regions(target, history)
    assert crash.kind == "crash" and crash.trial == 1
    c = SearchProposer(warm_start=[K | {"max_batch_size": 32}, other | {"max_batch_size": 32}]).propose(history, target)
    assert c.knobs == K | {"max_batch_size": 32} and "skipped" not in c.extra  # the crash's neighbour is open


def test_regions_are_rebuilt_from_the_stored_trials_after_a_resume(tmp_path):
    target, url = small_target(), f"sqlite:///{tmp_path / 'run.db'}"
    store = Store(url)
    run, _ = _store_history(store, target, [({}, "kept", 1.0, None), (K, "failed", None, OOM)])
    store.close() if hasattr(store, "close") else None
    del store
    reopened = Store(url)  # a new process: nothing but the database
    history = reopened.list_trials(run.id)
    [region] = failed_regions(target, history)
    assert region.trial == 1 and region.contains(K | {"max_batch_size": 32})
    c = SearchProposer(warm_start=[K | {"prefill_chunk": 0}]).propose(history, target)
    assert not region.contains(c.knobs) and c.extra["skipped"][0]["knobs"] == K | {"prefill_chunk": 0}


def test_why_names_the_region_a_failed_trial_marked_and_the_run_lists_them():
    target, store = small_target(), Store("sqlite://")
    run, history = _store_history(store, target, [({}, "kept", 1.0, None), (K, "failed", None, OOM)])
    failed = history[1]
    region = region_of(target, failed.number, failed.knobs, failed.status, failed.error)
    d = verdict.why_data(number=1, status="failed", proposer="search", score=None, best=1.0, min_gain=0.03, noise=0.0,
                         baseline_trial=0, gates=[], error=OOM, region=region)
    assert "marked the failed region (out of memory at #1:" in d["sentence"] and d["region"]["trial"] == 1
    store.add_event(run.id, "trial.why", d["sentence"], data=d, trial_id=failed.id)
    skip = {"key": knob_key(K | {"max_batch_size": 32}), "knobs": K | {"max_batch_size": 32}, "source": "TPE",
            "marked_by": 1, "region": region.to_dict()}
    store.add_event(run.id, "search.skip", "skipped", data=skip)
    w = explain_trial(store, run.id, 1)
    assert w.decided_by == "startup" and "max_batch_size in [16, 32]" in w.sentence and w.evidence["region"]["kind"] == "out_of_memory"
    assert explain_run(store, run.id)["failed_regions"] == [
        {"trial": 1, "kind": "out_of_memory", "region": region.describe(), "skipped": 1}]
    assert region_containing([region], K | {"max_batch_size": 8}) is None


def test_the_loop_records_each_skip_once_and_the_region_in_the_failed_trials_why():
    target, store = small_target(), Store("sqlite://")
    run, history = _store_history(store, target, [({}, "kept", 1.0, None), (K, "failed", None, OOM)])
    ctx = SimpleNamespace(store=store, target=target, run_id=run.id, on_step=lambda step: None, fit=lambda knobs: None)
    loop = Controller(ctx, SearchProposer(warm_start=[K | {"max_batch_size": 32}, K | {"max_batch_size": 8}]))
    assert loop._propose().knobs == K | {"max_batch_size": 8}
    loop._propose()  # proposed again from the same history: the same skip is not recorded twice
    [skip] = store.events(run.id, kind="search.skip")
    assert skip.data["marked_by"] == 1 and skip.data["source"] == "warm start" and "max_batch_size in [16, 32]" in skip.message
    loop._record_why(history[1], "failed", None, OOM, None)
    [why] = store.events(run.id, kind="trial.why")
    assert why.data["region"]["kind"] == "out_of_memory" and "marked the failed region" in why.message
