"""Search and scripted proposers over a real target spec and real store records."""

import json
from pathlib import Path

import pytest

from orchestrator.core.candidate import knob_key
from orchestrator.proposers import ScriptedProposer, SearchProposer, get_proposer
from orchestrator.store import Store
from orchestrator.targets import load_target

TARGET = Path(__file__).resolve().parents[2] / "examples" / "targets" / "hfserve.toml"


@pytest.fixture
def target():
    return load_target(TARGET)


@pytest.fixture
def store():
    return Store("sqlite://")


def _history(store, target, results):
    """Store trials with (knobs, status, score) and return the records, like a real run does."""
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    for i, (knobs, status, score) in enumerate(results):
        t = store.create_trial(run.id, i, commit="", knobs=target.validate_knobs(knobs), rationale="", proposer="search")
        store.finish_trial(t.id, status, score=score)
    return store.list_trials(run.id)


def test_search_is_reproducible_and_never_repeats(target, store):
    history = _history(store, target, [({}, "kept", 1.0)])
    a = SearchProposer(seed=7).propose(history, target)
    b = SearchProposer(seed=7).propose(history, target)
    assert a.knobs == b.knobs, "same seed + same history = same proposal (resume depends on it)"
    assert target.validate_knobs(a.knobs) == a.knobs
    assert knob_key(a.knobs) != knob_key(history[0].knobs)


def test_search_learns_from_scores(target, store):
    # After a clear signal (batching on scores high, off scores low), TPE should favour batching on.
    results = [({}, "kept", 1.0)]
    for i in range(8):
        on = i % 2 == 0
        knobs = {"batching": "on" if on else "off", "max_batch_size": 2 + i, "decode_loop": "manual" if i % 4 < 2 else "generate"}
        results.append((knobs, "kept" if on else "discarded", 3.0 if on else 0.9))
    history = _history(store, target, results)
    picks = [SearchProposer(seed=s, n_startup=4).propose(history, target).knobs["batching"] for s in range(10)]
    assert picks.count("on") >= 7, picks


def test_failed_trials_count_as_worst(target, store):
    history = _history(store, target, [({}, "kept", 1.0), ({"dtype": "bfloat16"}, "invalid", None)])
    c = SearchProposer(seed=1).propose(history, target)
    assert c is not None and knob_key(c.knobs) not in {knob_key(t.knobs) for t in history}


def test_warm_start_goes_first_and_only_once(target, store):
    warm = {"batching": "on", "decode_loop": "manual"}
    history = _history(store, target, [({}, "kept", 1.0)])
    first = SearchProposer(seed=0, warm_start=[warm]).propose(history, target)
    assert first.knobs == target.validate_knobs(warm) and "warm start" in first.rationale
    history = _history(store, target, [({}, "kept", 1.0), (warm, "kept", 2.0)])
    second = SearchProposer(seed=0, warm_start=[warm]).propose(history, target)
    assert second.knobs != first.knobs


def test_scripted_replays_by_position(target, store, tmp_path):
    steps = [{"batching": "on"}, {"knobs": {"dtype": "bfloat16"}, "rationale": "try bf16"}]
    p = ScriptedProposer(steps)
    assert p.propose(_history(store, target, [({}, "kept", 1.0)]), target).knobs == {"batching": "on"}
    h2 = _history(store, target, [({}, "kept", 1.0), ({"batching": "on"}, "kept", 2.0)])
    c = p.propose(h2, target)
    assert c.knobs == {"dtype": "bfloat16"} and c.rationale == "try bf16"
    h3 = _history(store, target, [({}, "kept", 1.0), ({"batching": "on"}, "kept", 2.0), ({"dtype": "bfloat16"}, "discarded", 0.9)])
    assert p.propose(h3, target) is None
    f = tmp_path / "steps.json"
    f.write_text(json.dumps(steps))
    assert isinstance(get_proposer(f"scripted:{f}"), ScriptedProposer)


def test_get_proposer_errors(tmp_path):
    assert isinstance(get_proposer("search"), SearchProposer)
    with pytest.raises(ValueError, match="does not exist"):
        get_proposer(f"scripted:{tmp_path / 'nope.json'}")
    with pytest.raises(ValueError, match="unknown proposer"):
        get_proposer("astrology")
