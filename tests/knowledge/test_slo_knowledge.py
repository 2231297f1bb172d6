"""An SLO run's findings say which knob moved the rate under the limits, and a later
SLO goal reuses them first. A real Store on SQLite, stub measurements (no server)."""

import pytest

from orchestrator.config.goal import parse_goal
from orchestrator.knowledge.kb import KnowledgeBase
from orchestrator.knowledge.reuse import for_goal
from orchestrator.knowledge.slofindings import limits_fit, rate_moves
from orchestrator.store import Store

HW = {"machine": "x86_64", "cpu_count": 16}
BASE = {"batching": "off", "max_batch_size": 8, "attn": "eager"}
RATE = "slo:slo_rate"
SLO_GOAL = parse_goal("maximize throughput with p90 TTFT under 300 ms and p90 TPOT under 40 ms within 10 trials")
WORKLOAD = "slo@1"


def slo_run(store, goal=SLO_GOAL, trials=()):
    """(knob changes, status, rate req/s) after a baseline at 2.0 req/s; the best rate is the run's best."""
    run = store.create_run("r", goal.text, goal.model_dump(mode="json"), goal.digest, {}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs=dict(BASE), rationale="", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={RATE: 2.0, "slo:ttft_ms_p90": 250.0})
    best = None
    for n, (changes, status, rate) in enumerate(trials, 1):
        t = store.create_trial(run.id, n, commit="", knobs={**BASE, **changes}, rationale="TPE proposal", proposer="search")
        store.finish_trial(t.id, status, score=rate / 2.0 if rate else None, objective={RATE: rate} if rate else None,
                           error=None if rate else "no rate met the SLO")
        if status == "kept" and (best is None or rate > best[1]):
            best = (t.id, rate)
    if best:
        store.set_best_trial(run.id, best[0])
    store.set_run_status(run.id, "finished", "budget")
    return run.id


TRIALS = [({"batching": "on"}, "kept", 3.0),                       # batching alone: +50%
          ({"attn": "sdpa"}, "discarded", 2.1),                    # sdpa alone: +5%
          ({"batching": "on", "max_batch_size": 32}, "kept", 3.6),  # +80%
          ({"max_batch_size": 32}, "failed", None)]                # no rate: not a move


def test_the_rate_at_the_slo_and_each_knob_change_with_its_delta(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    d = rate_moves(store, slo_run(store, trials=TRIALS))
    assert d["baseline"]["rate"] == 2.0 and d["best"]["trial"] == 3 and d["best"]["rate"] == 3.6
    assert [m["trial"] for m in d["moves"]] == [1, 2, 3] and d["moves"][0]["delta"] == pytest.approx(0.5)
    assert d["top_knob"] == "batching"  # measured alone, the largest move
    by = {e["knob"]: e for e in d["knobs"]}
    assert by["batching"]["alone_delta"] == pytest.approx(0.5) and by["batching"]["median_delta"] == pytest.approx(0.65)
    assert by["max_batch_size"]["alone_delta"] is None and by["attn"]["alone_delta"] == pytest.approx(0.05)


def test_a_goal_without_an_slo_rate_records_no_rate_moves(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    assert rate_moves(store, slo_run(store, parse_goal("improve throughput by 2x"), TRIALS)) is None


def test_write_back_names_the_rate_and_the_knob_changes_and_a_later_slo_goal_starts_from_them(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    kb = KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "kb")
    kb.write_back(store, slo_run(store, trials=TRIALS), engine="hfserve", model="forge:tiny", hardware=HW, workload=WORKLOAD)
    found = [e for e in KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "kb").entries.values() if e.meta.get("slo")]
    assert len(found) == 1
    e = found[0]
    assert "`batching` moved the request rate at p90 TTFT <= 300 ms and p90 TPOT <= 40 ms" in e.title
    assert "was 2 req/s at the baseline and 3.6 req/s at trial #3 (+80%)" in e.body
    assert "- `batching` 'off' -> 'on': +50% alone, median +65% over trials [1, 3]" in e.body
    assert e.meta["slo_rate"] == {"baseline": 2.0, "best": 3.6, "unit": "req/s"}
    assert e.meta["knobs"] == {**BASE, "batching": "on", "max_batch_size": 32}
    assert e.meta["evidence"][0]["moves"][1] == {"trial": 2, "status": "discarded", "changed": {"attn": ["eager", "sdpa"]},
                                                  "rate": 2.1, "delta": 0.05}

    # A plain throughput run on the same host wins more (its speedup is higher), at fixed concurrency.
    plain = parse_goal("improve throughput by 2x")
    other = slo_run(store, plain, [({"attn": "sdpa", "max_batch_size": 16}, "kept", 8.0)])
    kb2 = KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "kb")
    kb2.write_back(store, other, engine="hfserve", model="forge:tiny", hardware=HW, workload=WORKLOAD)
    kb3 = KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "kb")
    later = parse_goal("maximize throughput with p90 TTFT under 250 ms and p90 TPOT under 40 ms")
    warm = kb3.warm_start(engine="hfserve", model="forge:tiny", hardware=HW, workload=WORKLOAD, slo=later.slo)
    assert warm[0] == e.meta["knobs"]  # the SLO finding first, for a later SLO goal
    assert kb3.warm_start(engine="hfserve", model="forge:tiny", hardware=HW, workload=WORKLOAD)[0] != e.meta["knobs"]


def test_only_findings_under_a_fitting_slo_are_picked_closest_limits_first(tmp_path):
    later = parse_goal("maximize throughput with p90 TTFT under 250 ms and p90 TPOT under 40 ms").slo
    key = {"maximize": "rate", "limits": [{"metric": "ttft", "stat": "p90", "value": 300.0},
                                          {"metric": "tpot", "stat": "p90", "value": 40.0}]}
    assert limits_fit(key, later) == pytest.approx(0.8333, abs=1e-4)
    assert limits_fit({**key, "maximize": "goodput"}, later) == 0.0
    assert limits_fit({**key, "limits": key["limits"][:1]}, later) == 0.0  # another set of limits
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    kb = KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "kb")
    kb.write_back(store, slo_run(store, trials=TRIALS), engine="hfserve", model="forge:tiny", hardware=HW, workload=WORKLOAD)
    loose = parse_goal("maximize throughput with p90 TTFT under 3 s and p90 TPOT under 400 ms")
    kb.write_back(store, slo_run(store, loose, [({"attn": "sdpa"}, "kept", 5.0)]), engine="hfserve", model="forge:tiny",
                  hardware=HW, workload=WORKLOAD)
    kb = KnowledgeBase([tmp_path / "kb"], write_dir=tmp_path / "kb")
    ranked = kb.similar(kb.setting(engine="hfserve", model="forge:tiny", hardware=HW, workload=WORKLOAD), kind="finding")
    ordered = for_goal(ranked, later)
    assert [e.meta["slo"]["limits"][0]["value"] for _, e in ordered if e.meta.get("slo")] == [300.0, 3000.0]
    assert for_goal(ranked, None) == ranked
