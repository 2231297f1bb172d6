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
    # Seed findings carry no `knobs`: they inform, they never warm-start a run by themselves.
    assert not [e.id for e in kb.entries.values() if e.meta.get("knobs")]


def test_gpu_entries_reach_gpu_runs_not_cpu_runs():
    kb = KnowledgeBase([ROOT / "knowledge_base"], write_dir=ROOT / "knowledge_base")
    gpu = {e.id for _, e in kb.similar(kb.setting(engine="vllm", model="forge:7b-shape", hardware=H200), min_sim=0.5)}
    cpu = {e.id for _, e in kb.similar(kb.setting(engine="hfserve", model="forge:small", hardware=CPU2), min_sim=0.5)}
    assert "constraint-speed-of-light" in gpu and "constraint-speed-of-light" not in cpu
    assert "constraint-measure-in-pairs" in cpu and "playbook-hfserve-knobs" in cpu and "playbook-vllm-knobs" not in cpu
    assert "finding-hfserve-cpu-knobs" in cpu  # tiny's finding reaches small as a prior


def test_skills_load_with_names_and_descriptions():
    skills = load_skills(ROOT / "skills")
    for want in ("profile-server", "kv-cache-dtype", "cuda-graphs", "prefix-caching", "batching-decode",
                 "speculative-decoding", "verify-accuracy", "avoid-reward-hacks"):
        assert want in skills and skills[want].description and len(skills[want].body) > 200
