"""Reuse across models: A's finding reaches B as a weighted prior; B's outcome re-rates it."""

from kbfixtures import make_run

from orchestrator.knowledge import KnowledgeBase, parse_entry
from orchestrator.knowledge.reuse import translate
from orchestrator.store import Store

CPU2 = {"machine": "x86_64", "cpu_count": 2, "gpus": []}
H100 = {"machine": "x86_64", "cpu_count": 32, "gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB"]}
H200 = {"machine": "x86_64", "cpu_count": 32, "gpus": ["NVIDIA H200, 143771 MiB"]}
WIN = {"batching": "on", "max_batch_size": 6}
TPS = {"throughput:output_tps": 800.0}


def _kb_with_a_finding(tmp_path, store, status_stop="GoalMet: confirmed", hardware=CPU2):
    rid = make_run(store, [(WIN, "kept", 4.0, TPS, None)], best=1, stop=status_stop)
    kb = KnowledgeBase([tmp_path], write_dir=tmp_path)
    path = kb.write_back(store, rid, engine="hfserve", model="forge:tiny", hardware=hardware, workload="throughput@0.5")
    return path


def test_prior_from_model_a_reaches_model_b_weighted(tmp_path):
    store = Store("sqlite://")
    _kb_with_a_finding(tmp_path, store)
    kb = KnowledgeBase([tmp_path], write_dir=tmp_path)
    (p,) = kb.priors(engine="hfserve", model="forge:small", hardware=CPU2, workload="throughput@0.5")
    assert p["knobs"]["batching"] == "on" and 0.5 < p["similarity"] < 1.0 and p["weight"] < p["similarity"]
    # exact setting: weight is the status weight alone
    (q,) = kb.priors(engine="hfserve", model="forge:tiny", hardware=CPU2, workload="throughput@0.5")
    assert q["similarity"] == 1.0 and q["weight"] > p["weight"]
    # not a prior: another engine, another hardware class, an unrelated workload
    assert kb.warm_start(engine="vllm", model="forge:small", hardware=CPU2) == []
    assert kb.warm_start(engine="hfserve", model="forge:small", hardware=H100) == []
    assert kb.warm_start(engine="hfserve", model="forge:small", hardware=CPU2, workload="prefill@0.5") == []
    ctx = kb.context(engine="hfserve", hardware=CPU2, model="forge:small", workload="throughput@0.5")
    assert "PRIOR from model forge:tiny" in ctx and "verify here" in ctx


def test_confirmation_on_b_raises_and_contradiction_lowers(tmp_path):
    store = Store("sqlite://")
    a_path = _kb_with_a_finding(tmp_path, store)
    assert parse_entry(a_path).status == "probable"
    warm = {1: "warm start: a prior best from the knowledge base"}
    b1 = make_run(store, [(WIN, "kept", 3.1, TPS, None)], best=1, rationale=warm)
    KnowledgeBase([tmp_path], write_dir=tmp_path).write_back(store, b1, engine="hfserve", model="forge:small",
                                                              hardware=CPU2, workload="throughput@0.5")
    e = parse_entry(a_path)
    assert e.status == "confirmed" and e.meta["evidence"][-1]["on_model"] == "forge:small"
    assert e.meta["evidence"][-1]["result"] == "confirmed" and e.meta["evidence"][-1]["run"] == b1
    # On another similar model the same knobs lose to the baseline: two contradictions, two steps down.
    for model in ("forge:7b-shape", "forge:7b-shape"):
        b = make_run(store, [(WIN, "discarded", 0.8, TPS, None)], stop="BudgetExhausted", rationale=warm)
        KnowledgeBase([tmp_path], write_dir=tmp_path).write_back(store, b, engine="hfserve", model=model,
                                                                 hardware=CPU2, workload="throughput@0.5")
    e = parse_entry(a_path)
    assert e.status == "hypothesis" and [x.get("result") for x in e.meta["evidence"][-2:]] == ["contradicted"] * 2
    # A refuted finding never warm-starts anything.
    b = make_run(store, [(WIN, "failed", None, None, "HostError: exited")], stop="BudgetExhausted", rationale=warm)
    KnowledgeBase([tmp_path], write_dir=tmp_path).write_back(store, b, engine="hfserve", model="forge:small",
                                                             hardware=CPU2, workload="throughput@0.5")
    assert parse_entry(a_path).status == "refuted"
    assert KnowledgeBase([tmp_path], write_dir=tmp_path).warm_start(
        engine="hfserve", model="forge:small", hardware=CPU2, workload="throughput@0.5") == []


def test_seed_entry_is_copied_before_its_status_changes(tmp_path):
    store = Store("sqlite://")
    seed = tmp_path / "seed"
    a_path = _kb_with_a_finding(seed, store)
    before = a_path.read_text()
    ws = tmp_path / "ws"
    b = make_run(store, [(WIN, "kept", 3.0, TPS, None)], best=1, rationale={1: "warm start: prior"})
    KnowledgeBase([seed, ws], write_dir=ws).write_back(store, b, engine="hfserve", model="forge:small", hardware=CPU2,
                                                       workload="throughput@0.5")
    assert a_path.read_text() == before
    assert parse_entry(ws / "findings" / a_path.name).status == "confirmed"


def test_batch_knobs_scale_with_kv_room_on_gpus_only():
    src = KnowledgeBase.setting(engine="vllm", model="forge:7b-shape", hardware=H100)
    dst = KnowledgeBase.setting(engine="vllm", model="forge:7b-shape", hardware=H200)
    assert translate({"max_num_seqs": 64, "x": 1}, src, dst) == {"max_num_seqs": 113, "x": 1}  # 141/80 GB
    cpu = KnowledgeBase.setting(engine="vllm", model="forge:small", hardware=CPU2)
    assert translate({"max_num_seqs": 64}, {**cpu, "model": "forge:tiny"}, cpu) == {"max_num_seqs": 64}


def test_failed_directions_are_skipped_unless_they_won_in_combination(tmp_path):
    store = Store("sqlite://")
    _kb_with_a_finding(tmp_path, store)  # winner: batching=on, max_batch_size=6
    # A second run on model A where max_batch_size=6 alone crashed and bfloat16 never paid off.
    rid = make_run(store, [
        ({"max_batch_size": 6}, "failed", None, None, "HostError: the server exited before it became healthy"),
        ({"dtype": "bfloat16"}, "discarded", 0.8, TPS, None), ({"dtype": "bfloat16", "threads": 1}, "discarded", 0.7, TPS, None),
        ({"threads": 1, "batching": "on"}, "kept", 1.5, TPS, None),
    ], stop="BudgetExhausted", best=4)
    KnowledgeBase([tmp_path], write_dir=tmp_path).write_back(store, rid, engine="hfserve", model="forge:tiny",
                                                              hardware=CPU2, workload="throughput@0.5")
    kb = KnowledgeBase([tmp_path], write_dir=tmp_path)
    avoid = kb.avoid(engine="hfserve", model="forge:small", hardware=CPU2, workload="throughput@0.5")
    assert avoid == {"dtype": ["bfloat16"]}  # max_batch_size=6 won together with batching=on
    warm = kb.warm_start(engine="hfserve", model="forge:small", hardware=CPU2, workload="throughput@0.5")
    assert warm[0]["batching"] == "on" and warm[0]["max_batch_size"] == 6


def test_a_finding_from_another_workload_does_not_warm_start(tmp_path):
    store = Store("sqlite://")
    rid = make_run(store, [(WIN, "kept", 3.0, TPS, None)], best=1)
    kb_dir = tmp_path / "kb"
    KnowledgeBase([kb_dir], write_dir=kb_dir).write_back(store, rid, engine="hfserve", model="m", hardware=CPU2,
                                                         workload="decode@1")
    kb = KnowledgeBase([kb_dir], write_dir=kb_dir)
    assert kb.warm_start(engine="hfserve", model="m", hardware=CPU2, workload="decode@1")[0]["batching"] == "on"
    # Proven on single-stream decode; a batched load is another workload, not even a prior.
    assert kb.warm_start(engine="hfserve", model="m", hardware=CPU2, workload="decode+throughput@0.5") == []
    # Same scenarios at another scale: a prior (similarity 0.8).
    assert kb.priors(engine="hfserve", model="m", hardware=CPU2, workload="decode@2")[0]["similarity"] == 0.8


def test_a_runs_measured_knob_sets_become_the_search_prior_of_a_similar_run(tmp_path):
    store = Store("sqlite://")
    rid = make_run(store, [(WIN, "kept", 4.0, TPS, None), ({"dtype": "bfloat16"}, "discarded", 0.6, TPS, None),
                           ({"threads": 1}, "failed", None, None, "server exited")], best=1)
    kb = KnowledgeBase([tmp_path], write_dir=tmp_path)
    winner = parse_entry(kb.write_back(store, rid, engine="hfserve", model="forge:tiny", hardware=CPU2, workload="throughput@0.5"))
    assert [o["score"] for o in winner.meta["observations"]] == [4.0, 0.6, 0.0]  # failures count as 0
    kb = KnowledgeBase([tmp_path], write_dir=tmp_path)
    obs = kb.prior_observations(engine="hfserve", model="forge:small", hardware=CPU2, workload="throughput@0.5")
    assert len(obs) == 3 and all(0.5 < o["weight"] < 1.0 for o in obs)
    assert obs[0]["knobs"] == {**WIN, "dtype": "float32", "threads": 2}
    # not a prior where the setting is too different (another hardware class, another workload)
    assert kb.prior_observations(engine="hfserve", model="forge:small", hardware=H100, workload="throughput@0.5") == []
    assert kb.prior_observations(engine="hfserve", model="forge:small", hardware=CPU2, workload="decode@0.5") == []
