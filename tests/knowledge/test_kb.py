"""Knowledge base: parse the seed, search by applicability, write back and promote findings."""

from pathlib import Path

import pytest

from orchestrator.knowledge import KnowledgeBase, parse_entry
from orchestrator.store import Store

SEED = Path(__file__).resolve().parents[2] / "knowledge_base"
HW = {"machine": "x86_64", "cpu_count": 2, "gpus": []}


def test_seed_entries_parse_with_required_fields():
    kb = KnowledgeBase([SEED], write_dir=SEED)
    assert kb.entries, "the shipped seed is not empty"
    for e in kb.entries.values():
        for key in ("id", "kind", "title", "status", "created", "updated"):
            assert key in e.meta, f"{e.path.name} lacks {key}"
        assert e.kind in ("contract", "constraint", "finding", "playbook")


def test_search_respects_applies_to():
    kb = KnowledgeBase([SEED], write_dir=SEED)
    vllm = {e.id for e in kb.search(engine="vllm")}
    hf = {e.id for e in kb.search(engine="hfserve")}
    assert "finding-public-vllm-search" in vllm and "finding-public-vllm-search" not in hf
    assert "contract-accuracy-is-gated" in vllm & hf  # "*" applies everywhere


def test_bad_entry_is_a_clear_error(tmp_path):
    (tmp_path / "x.md").write_text("no frontmatter here")
    with pytest.raises(ValueError, match="frontmatter"):
        parse_entry(tmp_path / "x.md")


def _run_with_best(store, knobs, score, stop_reason):
    run = store.create_run("r", "beat the baseline by 20% on TPOT", {}, "h", {}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs={"batching": "off"}, rationale="", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0)
    t1 = store.create_trial(run.id, 1, commit="", knobs=knobs, rationale="", proposer="search")
    store.finish_trial(t1.id, "kept", score=score, objective={"decode:tpot_ms_p50": 5.0})
    store.set_best_trial(run.id, t1.id)
    store.set_run_status(run.id, "finished", stop_reason)
    return run.id


def test_write_back_then_warm_start_then_promotion(tmp_path):
    store = Store("sqlite://")
    kb_dir = tmp_path / "kb"
    knobs = {"batching": "on", "decode_loop": "manual"}
    kb = KnowledgeBase([SEED, kb_dir], write_dir=kb_dir)
    assert kb.warm_start(engine="hfserve", model="forge:tiny", hardware=HW) == []

    r1 = _run_with_best(store, knobs, 2.5, "GoalMet: confirmed")
    path = kb.write_back(store, r1, engine="hfserve", model="forge:tiny", hardware=HW)
    e = parse_entry(path)
    assert e.status == "probable" and e.meta["knobs"] == knobs
    assert e.meta["evidence"][0]["run"] == r1 and e.meta["evidence"][0]["trial"] == 1

    kb2 = KnowledgeBase([SEED, kb_dir], write_dir=kb_dir)
    assert kb2.warm_start(engine="hfserve", model="forge:tiny", hardware=HW) == [knobs]
    assert kb2.warm_start(engine="vllm", model="forge:tiny", hardware=HW) == []
    # the CPU run's finding never reaches a GPU run (the seed's own H200 finding may: it is a GPU run's)
    assert knobs not in kb2.warm_start(engine="hfserve", model="forge:tiny", hardware={"gpus": ["NVIDIA H200, 141 GB"]})

    r2 = _run_with_best(store, knobs, 2.7, "GoalMet: confirmed")
    kb2.write_back(store, r2, engine="hfserve", model="forge:tiny", hardware=HW)
    e2 = parse_entry(path)
    assert e2.status == "confirmed" and len(e2.meta["evidence"]) == 2 and e2.meta["speedup"] == 2.7
    # Writing the same run twice adds no evidence.
    kb2.write_back(store, r2, engine="hfserve", model="forge:tiny", hardware=HW)
    assert len(parse_entry(path).meta["evidence"]) == 2


def test_no_finding_without_a_winner(tmp_path):
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    kb = KnowledgeBase([SEED], write_dir=tmp_path)
    assert kb.write_back(store, run.id, engine="hfserve", model="m", hardware=HW) is None


def test_findings_are_keyed_by_workload_and_carry_the_paired_ratio(tmp_path):
    from orchestrator.knowledge import workload_key

    store = Store("sqlite://")
    kb_dir = tmp_path / "kb"
    knobs = {"batching": "on"}
    decode, load = workload_key(["decode"], 1.0), workload_key(["throughput", "decode"], 0.5)
    assert load == "decode+throughput@0.5"
    rid = _run_with_best(store, knobs, 3.1, "GoalMet: paired")
    best = store.get_run(rid).best_trial_id
    store.add_event(rid, "paired", "p", data={"score": 3.1, "lo": 2.9, "hi": 3.3, "rounds": 3, "met": True}, trial_id=best)
    path = KnowledgeBase([kb_dir], write_dir=kb_dir).write_back(store, rid, engine="hfserve", model="m", hardware=HW,
                                                                 workload=decode)
    e = parse_entry(path)
    assert e.applies_to["workload"] == decode and e.meta["evidence"][0]["paired"]["lo"] == 2.9
    kb = KnowledgeBase([kb_dir], write_dir=kb_dir)
    assert kb.warm_start(engine="hfserve", model="m", hardware=HW, workload=decode) == [knobs]
    # Proven on single-stream decode; not applied to a batched load.
    assert kb.warm_start(engine="hfserve", model="m", hardware=HW, workload=load) == []
