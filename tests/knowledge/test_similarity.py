"""Similarity: model descriptions from config.json, hardware classes, workloads; priors, not facts."""

import json

from orchestrator.knowledge import KnowledgeBase, workload_key
from orchestrator.knowledge.fingerprint import (
    describe_hardware,
    describe_model,
    hardware_similarity,
    model_similarity,
    similarity,
    workload_similarity,
)

CPU2 = {"machine": "x86_64", "cpu_count": 2, "gpus": []}
H100 = {"machine": "x86_64", "cpu_count": 32, "gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 550.54"]}
H200 = {"machine": "x86_64", "cpu_count": 32, "gpus": ["NVIDIA H200, 143771 MiB, 550.54"]}


def test_model_description_from_config_json(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    d = describe_model(str(tmp_path))
    assert d["family"] == "llama" and d["attention"] == "gqa" and d["kv_heads"] == 8 and d["head_dim"] == 128
    assert d["dtype"] == "bfloat16" and 7000 < d["params_m"] < 7500  # Mistral-7B shape: ~7.2B parameters
    tiny = describe_model("forge:tiny")
    assert tiny["family"] == "llama" and tiny["vocab"] == 2048 and tiny["kv_heads"] == 2 and tiny["params_m"] < 2
    # A forge preset is described in the dtype its weights are saved in: CPU presets float32, the GPU
    # presets their gpu_dtype (the H200 2B run's finding said float32 for a bf16-built model).
    assert tiny["dtype"] == "float32" and describe_model("forge:7b-shape")["dtype"] == "float32"
    assert describe_model("forge:7b-peaked")["dtype"] == describe_model("forge:2b-peaked")["dtype"] == "bfloat16"


def test_model_similarity_orders_by_size_and_shape():
    tiny, small, big = describe_model("forge:tiny"), describe_model("forge:small"), describe_model("forge:7b-shape")
    assert model_similarity(tiny, tiny) == 1.0
    assert 0.5 < model_similarity(tiny, big) < model_similarity(tiny, small) < 1.0
    other = {**small, "name": "x", "family": "gpt2", "attention": "mha", "dtype": "bfloat16"}
    assert model_similarity(tiny, other) < model_similarity(tiny, small)


def test_hardware_classes():
    c2, h100, h200 = describe_hardware(CPU2), describe_hardware(H100), describe_hardware(H200)
    assert c2["class"] == "cpu" and h100["gpu_class"] == "H100" and h200["memory_gb"] == 141
    assert hardware_similarity(c2, h100) == 0.1
    assert hardware_similarity(h100, h200) < hardware_similarity(h200, h200) == 1.0
    assert hardware_similarity(c2, describe_hardware({**CPU2, "cpu_count": 64})) < hardware_similarity(c2, c2)


def test_workload_key_and_similarity():
    assert workload_key(["throughput", "decode"], 1) == "decode+throughput@1"
    assert workload_similarity("decode+throughput@1", "decode+throughput@1") == 1.0
    assert workload_similarity("decode+throughput@1", "decode+throughput@2") == 0.8
    assert workload_similarity("decode+throughput@1", "prefill@1") == 0.0
    assert 0 < workload_similarity("decode+throughput@1", "decode@1") < 0.8


def test_similarity_of_settings_is_a_product():
    here = KnowledgeBase.setting(engine="hfserve", model="forge:small", hardware=CPU2, workload="throughput@1")
    same = dict(here)
    other_model = KnowledgeBase.setting(engine="hfserve", model="forge:tiny", hardware=CPU2, workload="throughput@1")
    gpu = KnowledgeBase.setting(engine="hfserve", model="forge:tiny", hardware=H100, workload="throughput@1")
    assert similarity(same, here) == 1.0
    assert 0.6 < similarity(other_model, here) < 1.0
    assert similarity(gpu, here) < 0.1
    assert similarity({**other_model, "engine": "vllm"}, here) == 0.0
    assert similarity({"engine": "*"}, here) == 1.0  # a contract applies everywhere


def test_old_findings_without_descriptions_are_described_from_the_name():
    here = KnowledgeBase.setting(engine="hfserve", model="forge:small", hardware=CPU2)
    old = {"engine": "hfserve", "model": "forge:tiny", "hardware": "cpu-x86_64-2c"}  # written by the first KB
    assert 0.6 < similarity(old, here) < 1.0
    assert similarity({**old, "model": "some-unknown-name"}, here) == 0.3
