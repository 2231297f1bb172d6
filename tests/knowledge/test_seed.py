"""The shipped seed KB and skills: every entry lints clean, the issue's topics are covered."""

from pathlib import Path

from orchestrator.agent.tools import load_skills
from orchestrator.knowledge import KnowledgeBase
from orchestrator.knowledge.lint import lint

ROOT = Path(__file__).resolve().parents[2]
CPU2 = {"machine": "x86_64", "cpu_count": 2, "gpus": []}
H200 = {"machine": "x86_64", "cpu_count": 32, "gpus": ["NVIDIA H200, 143771 MiB"]}


def test_seed_lints_clean_and_covers_the_topics():
    assert lint([ROOT / "knowledge_base"]) == []
    kb = KnowledgeBase([ROOT / "knowledge_base"], write_dir=ROOT / "knowledge_base")
    ids = set(kb.entries)
    for want in ("contract-openai-api-surface", "contract-metric-definitions", "contract-accuracy-is-gated",
                 "constraint-gpu-specs", "constraint-speed-of-light", "constraint-features-need-hardware",
                 "playbook-vllm-knobs", "playbook-sglang-knobs", "playbook-tgi-knobs",
                 "playbook-transformers-serve-knobs", "playbook-hfserve-knobs"):
        assert want in ids
    # A seed finding with `knobs` warm-starts runs: only GPU findings of one engine carry them (written by a
    # GPU run and committed with its evidence); a CPU run never reaches them (test below).
    with_knobs = [e for e in kb.entries.values() if e.meta.get("knobs")]
    assert [e.id for e in with_knobs] == ["finding-hfserve-f8a2c356c5"]
    for e in with_knobs:
        assert e.applies_to["engine"] and e.applies_to["hardware_desc"]["class"] == "gpu" and e.meta["evidence"]


def test_gpu_entries_reach_gpu_runs_not_cpu_runs():
    kb = KnowledgeBase([ROOT / "knowledge_base"], write_dir=ROOT / "knowledge_base")
    gpu = {e.id for _, e in kb.similar(kb.setting(engine="vllm", model="forge:7b-shape", hardware=H200), min_sim=0.5)}
    cpu = {e.id for _, e in kb.similar(kb.setting(engine="hfserve", model="forge:small", hardware=CPU2), min_sim=0.5)}
    assert "constraint-speed-of-light" in gpu and "constraint-speed-of-light" not in cpu
    assert "constraint-measure-in-pairs" in cpu and "playbook-hfserve-knobs" in cpu and "playbook-vllm-knobs" not in cpu
    assert "finding-hfserve-cpu-knobs" in cpu  # tiny's finding reaches small as a prior


def test_the_h200_finding_warm_starts_a_7b_on_an_h200_and_no_cpu_run(tmp_path):
    from orchestrator.config.workspace import Workspace
    from orchestrator.knowledge import reuse

    kb = KnowledgeBase([ROOT / "knowledge_base"], write_dir=ROOT / "knowledge_base")
    gpu = kb.setting(engine="hfserve", model="forge:7b-peaked", hardware=H200)
    cpu = kb.setting(engine="hfserve", model="forge:tiny", hardware=CPU2)
    warm = [e.id for _, e, _ in reuse.warm_knobs(kb.similar(gpu), gpu, {})]
    assert warm == ["finding-hfserve-f8a2c356c5"]
    assert not reuse.warm_knobs(kb.similar(cpu), cpu, {}) and not reuse.prior_observations(kb.similar(cpu), cpu)
    # A cold run (the time-to-best benchmark's empty knowledge base) reads its own kb only.
    (tmp_path / "infergoal.toml").write_text("kb_seed = false\n")
    assert (ROOT / "knowledge_base").resolve() not in Workspace(tmp_path).kb_read_dirs
    assert (ROOT / "knowledge_base").resolve() in Workspace(tmp_path / "other").kb_read_dirs


def test_skills_load_with_names_and_descriptions():
    skills = load_skills(ROOT / "skills")
    for want in ("profile-server", "kv-cache-dtype", "cuda-graphs", "prefix-caching", "batching-decode",
                 "speculative-decoding", "verify-accuracy", "avoid-reward-hacks"):
        assert want in skills and skills[want].description and len(skills[want].body) > 200
