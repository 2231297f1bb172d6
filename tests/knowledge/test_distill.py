"""Distill a run from a synthetic store: knob effects with importance, failures by kind, dead ends."""

from kbfixtures import make_run

from orchestrator.knowledge import KnowledgeBase, parse_entry
from orchestrator.knowledge.distill import classify_failure, distill
from orchestrator.store import Store

HW = {"machine": "x86_64", "cpu_count": 2, "gpus": []}


def _tps(x: float) -> dict[str, float]:
    return {"throughput:output_tps": 200.0 * x, "decode:tpot_ms_p50": 4.0}


def _store_with_run() -> tuple[Store, int]:
    store = Store("sqlite://")
    rid = make_run(store, [
        ({"batching": "on", "max_batch_size": 4}, "kept", 2.0, _tps(2.0), None),
        ({"dtype": "bfloat16"}, "discarded", 0.8, _tps(0.8), None),
        ({"batching": "on", "max_batch_size": 16}, "kept", 3.5, _tps(3.5), None),
        ({"dtype": "bfloat16", "threads": 1}, "discarded", 0.7, _tps(0.7), None),
        ({"threads": 1}, "failed", None, None, "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"),
        ({"max_batch_size": 32}, "failed", None, None, "HostError: the server exited before it became healthy"),
        ({"dtype": "bfloat16", "batching": "on"}, "invalid", None, None, "accuracy gate failed"),
        ({"batching": "on", "max_batch_size": 8}, "kept", 2.6, _tps(2.6), None),
    ], best=3)
    return store, rid


def test_distill_effects_failures_and_dead_ends():
    store, rid = _store_with_run()
    d = distill(store, rid)
    assert d.winner["trial"] == 3 and d.winner["knobs"]["max_batch_size"] == 16 and d.winner["score"] == 3.5
    knobs = {e["knob"]: e for e in d.effects}
    assert d.effects[0]["knob"] in ("batching", "max_batch_size")  # what moved the score most
    batching = knobs["batching"]
    assert batching["importance"]["score"] > knobs["threads"]["importance"].get("score", 0.0)
    on = batching["values"]["'on'"]
    assert on["trials"] == [1, 3, 8] and on["median_score"] == 2.6
    assert on["throughput:output_tps change"] == 1.6  # measured: median 520 tok/s vs 200 at the baseline
    kinds = {f["trial"]: f["kind"] for f in d.failures}
    assert kinds == {5: "oom", 6: "startup", 7: "gate"}
    gate = next(f for f in d.failures if f["kind"] == "gate")
    assert "accuracy" in gate["reason"] and gate["changed"] == {"dtype": "bfloat16", "batching": "on"}
    assert {(x["knob"], x["value"]) for x in d.dead_ends} == {("dtype", "bfloat16")}  # trials 2 and 4, both < 1x


def test_classify_failure_reads_the_log_tail():
    assert classify_failure("failed", "the server died during the benchmark", [], "Killed by signal 9")[0] == "oom"
    assert classify_failure("failed", "ValueError: bad", [], "", launched=False)[0] == "startup"
    assert classify_failure("failed", "ValueError: bad", [], "")[0] == "error"


def test_write_back_writes_effects_and_constraints_with_evidence(tmp_path):
    store, rid = _store_with_run()
    kb = KnowledgeBase([tmp_path], write_dir=tmp_path)
    winner = kb.write_back(store, rid, engine="hfserve", model="forge:tiny", hardware=HW, workload="throughput@1")
    assert parse_entry(winner).meta["applies_to"]["model_desc"]["family"] == "llama"
    effects = [parse_entry(p) for p in (tmp_path / "findings").glob("*knob-effects*")]
    assert len(effects) == 1 and effects[0].meta["evidence"][0]["run"] == rid
    assert "median score" in effects[0].body
    (cpath,) = (tmp_path / "constraints").glob("constraint-hfserve-avoid-*.md")
    c = parse_entry(cpath)
    avoid = {(a["knob"], a["value"]) for a in c.meta["avoid"]}
    # single-knob failures are blamed on their knob; the two-knob gate failure is recorded, not blamed
    assert avoid == {("threads", 1), ("max_batch_size", 32), ("dtype", "bfloat16")}
    assert len(c.meta["failures"]) == 3
    ev = store.events(rid, kind="kb.distill")
    assert ev and len(ev[0].data["written"]) == 3
    kb2 = KnowledgeBase([tmp_path], write_dir=tmp_path)
    assert kb2.avoid(engine="hfserve", model="forge:tiny", hardware=HW, workload="throughput@1")["dtype"] == ["bfloat16"]


def test_importance_judges_a_conditional_knob_over_every_trial():
    # A knob that exists only under another's value (`when`) is absent from the baseline's knobs;
    # it was left out of the importance because only the first row's knobs were looked at.
    from types import SimpleNamespace

    from orchestrator.knowledge.distill import _importance

    rows = [SimpleNamespace(knobs={"batching": "off"}, score=1.0, objective={})]
    rows += [SimpleNamespace(knobs={"batching": "on", "max_batch_size": b}, score=s, objective={})
             for b, s in ((2, 1.2), (8, 1.9), (24, 3.1), (31, 2.9), (4, 1.4))]
    rows += [SimpleNamespace(knobs={"batching": "off"}, score=1.05, objective={})]
    imp = _importance(rows, None)
    assert set(imp) == {"batching", "max_batch_size"} and imp["max_batch_size"] > 0


def test_probes_are_distilled_apart_and_reach_the_next_model_only_marked_as_probes(tmp_path):
    """The winner's one-knob neighbours measured after the stop (`probe` trials) become the finding's
    `probes` with the measured change, never its observations or dead ends; the next model's
    priors carry them marked `probe` (the search ranks swaps with them, never its model)."""
    store, rid = _store_with_run()
    win = store.get_trial(store.get_run(rid).best_trial_id)
    for n, (changes, status, score) in enumerate([({"dtype": "bfloat16"}, "discarded", 0.6), ({"threads": 1}, "discarded", 3.4),
                                                  ({"batching": "off"}, "failed", None)], start=9):
        t = store.create_trial(rid, n, commit="", knobs={**win.knobs, **changes}, rationale="probe: the winner", proposer="probe")
        store.finish_trial(t.id, status, score=score, error="HostError: exited" if status == "failed" else None)
    d = distill(store, rid)
    assert [(p["trial"], p["knob"], p["value"], p["score"]) for p in d.probes] == [
        (9, "dtype", "bfloat16", 0.6), (10, "threads", 1, 3.4), (11, "batching", "off", 0.0)]
    assert not any(o["knobs"] == {**win.knobs, "dtype": "bfloat16"} for o in d.observations)
    assert {(x["knob"], x["value"]) for x in d.dead_ends} == {("dtype", "bfloat16")}  # as before: trials 2 and 4 only
    assert any(f["trial"] == 11 for f in d.failures)  # a probe that failed is a failure like any other
    kb = KnowledgeBase([tmp_path], write_dir=tmp_path)
    path = kb.write_back(store, rid, engine="hfserve", model="forge:tiny", hardware=HW, workload="throughput@1")
    e = parse_entry(path)
    assert [p["trial"] for p in e.meta["probes"]] == [10, 9, 11]  # best first
    assert f"`dtype` = `bfloat16` (run {rid}, trial #9): 0.600x, -83% against the winner" in e.body
    priors = KnowledgeBase([tmp_path], write_dir=tmp_path / "w").prior_observations(
        engine="hfserve", model="forge:small", hardware=HW, workload="throughput@1")
    probes = [p for p in priors if p.get("probe")]
    assert len(probes) == 4 and len(priors) - 4 == len(d.observations)
    [winner] = [p for p in probes if p.get("winner")]  # the source's own winner travels with its probes
    assert winner["knobs"] == win.knobs and winner["score"] == 3.5
    assert sorted(p["score"] for p in probes if not p.get("winner")) == [0.0, 0.6, 3.4]
    # the same run written back again with one more probe (as a resumed run would): the probes and their text, once
    t = store.create_trial(rid, 12, commit="", knobs={**win.knobs, "max_batch_size": 8}, rationale="probe", proposer="probe")
    store.finish_trial(t.id, "discarded", score=2.6)
    kb.write_back(store, rid, engine="hfserve", model="forge:tiny", hardware=HW, workload="throughput@1")
    e = parse_entry(path)
    assert len(e.meta["probes"]) == 4 and e.body.count("One knob at a time") == 1
    assert "`max_batch_size` = `8`" in e.body


def test_paired_and_sentinel_measurements_are_not_failures_or_observations_of_their_knobs():
    # The H200 2B run: its paired rounds were redone (`invalid`, "round redone: its ratio 11.42x is far
    # from ..."); its constraint listed them as gate failures of the defaults, and its observations
    # scored the defaults 0.0. A paired half whose server broke on the relaunch is still a failure.
    from kbfixtures import BASE

    store, rid = _store_with_run()
    win = {**BASE, "batching": "on", "max_batch_size": 16}
    for n, (knobs, role, status, error) in enumerate([
        (BASE, "paired", "invalid", "round redone: its ratio 11.42x is far from the other rounds' median 20.73x"),
        (win, "paired", "invalid", "round redone: its ratio 11.42x is far from the other rounds' median 20.73x"),
        (BASE, "sentinel", "invalid", "untrusted measurement in throughput after 3 attempts: host busier"),
        (win, "paired", "failed", "HostError: the server exited before it became healthy"),
        (BASE, "paired", "kept", None),
    ], start=9):
        t = store.create_trial(rid, n, commit="", knobs=knobs, rationale=f"paired A/B of #3: {role}", proposer=role)
        store.finish_trial(t.id, status, error=error, objective={"throughput:output_tps": 200.0} if status == "kept" else None)
    d = distill(store, rid)
    assert {f["trial"]: f["kind"] for f in d.failures} == {5: "oom", 6: "startup", 7: "gate", 12: "startup"}
    assert sorted(o["score"] for o in d.observations) == sorted([2.0, 0.8, 3.5, 0.7, 0.0, 0.0, 0.0, 2.6])
    assert all(o["knobs"] != BASE for o in d.observations)


def test_one_trial_that_changed_every_knob_ranks_no_knob_and_names_no_top_knob(tmp_path):
    """Which of the 4 moved the score, one trial cannot tell: no importance, no knob-effects finding."""
    store = Store("sqlite://")
    every = {"batching": "on", "max_batch_size": 16, "dtype": "bfloat16", "threads": 1}
    rid = make_run(store, [(every, "kept", 1.4, _tps(1.4), None)], best=1)
    d = distill(store, rid)
    assert d.effects and all(not e["importance"] for e in d.effects)
    KnowledgeBase([tmp_path], write_dir=tmp_path).write_back(store, rid, engine="hfserve", model="forge:tiny",
                                                             hardware=HW, workload="throughput@1")
    assert not list((tmp_path / "findings").glob("*knob-effects*"))


def test_importance_needs_more_trials_than_knobs_varied():
    few = Store("sqlite://")  # 2 trials (3 knob sets with the baseline) over 4 knobs: not enough
    rid = make_run(few, [({"batching": "on", "max_batch_size": 16, "dtype": "bfloat16"}, "kept", 1.4, _tps(1.4), None),
                         ({"threads": 1, "max_batch_size": 4}, "discarded", 0.9, _tps(0.9), None)], best=1)
    assert all(not e["importance"] for e in distill(few, rid).effects)
    store, rid = _store_with_run()  # 5 scored trials over 3 knobs: ranked
    assert distill(store, rid).effects[0]["importance"]["score"] > 0


def _paired(store, rid, lo, hi, score):
    best = store.get_trial(store.get_run(rid).best_trial_id)
    store.add_event(rid, "paired", "#1: paired", trial_id=best.id,
                    data={"score": score, "lo": lo, "hi": hi, "confidence": 0.9, "rounds": 3, "met": False})


def test_a_winner_whose_paired_interval_holds_one_writes_no_knobs_giving_finding(tmp_path):
    """`1.11x [0.79, 1.49]`: nothing beat the baseline, so no "knobs giving 1.11x" entry; [1.2, 1.5] writes one."""
    for lo, hi, written in ((0.79, 1.49, False), (1.2, 1.5, True)):
        store = Store("sqlite://")
        rid = make_run(store, [({"batching": "on"}, "kept", 1.11, _tps(1.11), None)], best=1, stop="BudgetExhausted: 2 trials")
        _paired(store, rid, lo, hi, (lo + hi) / 2)
        kb_dir = tmp_path / str(lo)
        path = KnowledgeBase([kb_dir], write_dir=kb_dir).write_back(store, rid, engine="hfserve", model="forge:tiny",
                                                                    hardware=HW, workload="throughput@1")
        giving = [p for p in (kb_dir / "findings").glob("*.md") if "knobs giving" in p.read_text()]
        assert (path is not None) == written and bool(giving) == written, (lo, hi)
