"""A failure condemns its cause, not its region: a crash is attributed to one knob level, the search
still visits the crashed trial's other levels, and a start-up trial stakes only a few untried levels.

The real path first: the fake target's server (one level of its `fault` knob answers every request
with HTTP 500), the real loop and the real SearchProposer. Then the attribution's rules both ways on
stored histories of the GPU target."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from fake_target import write_fake_target

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.proposers.cover import capped
from orchestrator.proposers.search import ATTRIBUTE_PREFIX, MAX_UNTRIED, SearchProposer
from orchestrator.runs import start_run
from orchestrator.store import Store
from orchestrator.targets import load_target
from orchestrator.targets.attribution import attribute, bisect, is_crash

GPU = Path(__file__).resolve().parents[2] / "examples" / "targets" / "hfserve_gpu.toml"
SERVER_ERRORS = "16 of 16 requests failed in throughput@0.25 (server_error: 16)"


@pytest.fixture(autouse=True)
def _quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _history(store, target, rows):
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    for i, (knobs, status, score, error) in enumerate(rows):
        t = store.create_trial(run.id, i, commit="", knobs=target.validate_knobs(knobs), rationale="",
                               proposer="baseline" if i == 0 else "search")
        store.finish_trial(t.id, status, score=score, error=error)
    return run, store.list_trials(run.id)


@pytest.mark.slow  # launches (fake) servers
def test_the_crashing_level_is_found_and_the_rest_of_its_trial_still_searched(tmp_path, tiny_model):
    target = write_fake_target(
        tmp_path / "fake.toml", choices=(8.0, 4.0),
        extra_launch='{% if fault != "none" %} --fault {{ fault }} {% endif %} --ttft-ms {{ ttft }}',
        extra_knobs='[knobs.fault]\ntype = "categorical"\nchoices = ["none", "http500"]\ndefault = "none"\n'
                    '[knobs.ttft]\ntype = "categorical"\nchoices = [5, 1]\ndefault = 5')
    ws = Workspace(tmp_path, [f'target="{target}"', 'proposer="search"', "gates.accuracy=false", "gates.integrity=false",
                              "bench.scale=0.5", "bench.timeout_s=3", "kb_seed=false"])
    out = start_run(ws, parse_goal("beat the baseline by 90% on TPOT within 6 trials"))
    trials = [t for t in Store(ws.db_url).list_trials(out.run_id) if t.proposer == "search"]
    crashed = [t for t in trials if t.status == "failed"]
    assert crashed and all(t.knobs["fault"] == "http500" and is_crash(t) for t in crashed), [(t.knobs, t.error) for t in trials]
    first = crashed[0]
    # the attribution names the culprit, and only it: the search proposes it no more ...
    blame = attribute(load_target(target), trials)
    assert blame.culprits == {("fault", "'http500'")} and not blame.open
    after = [t for t in trials if t.number > crashed[-1].number]
    assert after and all(t.knobs["fault"] == "none" for t in after)
    # ... and still visits the crashed trial's other untried level (4 ms a token), which serves and is kept
    assert first.knobs["tpot_ms"] == 4.0
    assert any(t.knobs["tpot_ms"] == 4.0 and t.status == "kept" for t in after), [(t.knobs, t.status) for t in trials]
    assert any(t.rationale.startswith(ATTRIBUTE_PREFIX) for t in trials) or len(crashed) == 1


def test_a_crash_with_several_suspects_is_bisected_then_its_culprit_condemned():
    target, store = load_target(GPU), Store("sqlite://")
    k = {"engine": "fast-graphs", "batching": "on", "max_batch_size": 16, "kernels": "triton-mv", "sdpa": "efficient",
         "pdl": "on"}
    run, history = _history(store, target, [({}, "kept", 1.0, None), (k, "failed", None, SERVER_ERRORS)])
    blame = attribute(target, history)
    [(trial, suspect)] = blame.open
    assert not blame.culprits and suspect == ("engine", "batching", "max_batch_size", "sdpa", "kernels", "pdl")
    c = SearchProposer(seed=0).propose(history, target)
    assert c.rationale.startswith(ATTRIBUTE_PREFIX) and c.knobs == bisect(target, trial, suspect)
    # the top of the knob tree is kept, the rest reset
    assert c.knobs["engine"] == "fast-graphs" and c.knobs["sdpa"] == "auto" and c.knobs["kernels"] == "torch"
    # it served: its levels are cleared; bisect the rest until one is left
    t = store.create_trial(run.id, 2, commit="", knobs=c.knobs, rationale=c.rationale, proposer="search")
    store.finish_trial(t.id, "kept", score=5.0)
    for n in range(3, 9):
        history = store.list_trials(run.id)
        blame = attribute(target, history)
        if blame.culprits:
            break
        c = SearchProposer(seed=0).propose(history, target)
        assert c.rationale.startswith(ATTRIBUTE_PREFIX)
        t = store.create_trial(run.id, n, commit="", knobs=c.knobs, rationale=c.rationale, proposer="search")
        crash = c.knobs.get("sdpa") == "efficient"
        store.finish_trial(t.id, "failed" if crash else "kept", score=None if crash else 5.0, error=SERVER_ERRORS if crash else None)
    assert blame.culprits == {("sdpa", "'efficient'")} and not blame.open
    # from here the search never proposes it, and tells TPE the crash as the culprit's alone
    for seed in range(4):
        assert SearchProposer(seed=seed).propose(history, target).knobs.get("sdpa") != "efficient"
    assert set(blame.told[history[1].number]) == {"kernels", "sdpa", "pdl"} - {k for k in ("kernels", "pdl")
                                                                           if any(x.status == "kept" and x.knobs.get(k) == history[1].knobs[k] for x in history)}


def test_what_is_not_a_crash_or_has_no_suspect_condemns_nothing():
    target, store = load_target(GPU), Store("sqlite://")
    k = {"engine": "fast-eager", "batching": "on", "max_batch_size": 8}
    timeout = "start-up failure (timeout): still loading"
    oom = "start-up failure (out_of_memory): CUDA out of memory"
    for error in (timeout, oom, "accuracy gate: below the hard limit"):
        _, history = _history(store, target, [({}, "kept", 1.0, None), (k, "failed", None, error)])
        assert not is_crash(history[1]) and not attribute(target, history).culprits and not attribute(target, history).open
    # every level of the crashed set served elsewhere: a combination (or the host), not a level
    _, history = _history(store, target, [({}, "kept", 1.0, None), (k, "kept", 3.0, None), (k | {"max_batch_size": 16}, "kept", 3.1, None),
                                          (k | {"max_batch_size": 16}, "failed", None, SERVER_ERRORS)])
    blame = attribute(target, history)
    assert not blame.culprits and not blame.open and blame.told[history[3].number] == ()
    # the engine's refusal at start-up is attributed; the target's own constraints (never launched) are not
    refused = "start-up failure (constraint_violated): ValueError: --sdpa efficient is not supported with --prefill-attn fused"
    _, history = _history(store, target, [({}, "kept", 1.0, None), (k, "kept", 3.0, None), (k | {"sdpa": "efficient"}, "failed", None, refused)])
    assert is_crash(history[2]) and attribute(target, history).culprits == {("sdpa", "'efficient'")}
    _, history = _history(store, target, [({}, "kept", 1.0, None), (k, "failed", None, "start-up failure (constraint_violated, not launched): x")])
    assert not is_crash(history[1])
    # one suspect: condemned at once
    _, history = _history(store, target, [({}, "kept", 1.0, None), (k, "kept", 3.0, None), (k | {"sdpa": "efficient"}, "failed", None, SERVER_ERRORS)])
    assert attribute(target, history).culprits == {("sdpa", "'efficient'")}


def test_a_start_up_trial_stakes_at_most_a_few_untried_levels():
    target, store = load_target(GPU), Store("sqlite://")
    _, history = _history(store, target, [({}, "kept", 1.0, None)])
    served = {(k, repr(v)) for t in history for k, v in t.knobs.items()}
    for seed in range(6):
        c = SearchProposer(seed=seed).propose(history, target)
        untried = [k for k, v in c.knobs.items() if v != target.knobs[k].default and (k, repr(v)) not in served]
        assert 1 <= len(untried) <= MAX_UNTRIED, c.knobs
    # uncapped, the covering start-up stakes many more (what the cap is for)
    many = SearchProposer(seed=1, max_untried=None).propose(history, target)
    assert sum(1 for k, v in many.knobs.items() if v != target.knobs[k].default) > MAX_UNTRIED
    two = capped(target, many.knobs, served, 2)
    assert sum(1 for k, v in two.items() if v != target.knobs[k].default) == 2
    assert target.validate_knobs(two) == two
