"""The forge's GPU presets as the warm time-to-best run uses them (the GPU tool's ttb-small-2b and ttb-warm-7b): the
smaller shape's finding reaches the 7B (similar enough) with its batch size unscaled. No model is built."""

from __future__ import annotations

from orchestrator.knowledge import reuse
from orchestrator.knowledge.fingerprint import describe_model, model_similarity
from orchestrator.models.forge import PRESETS

H200 = {"class": "gpu", "memory_gb": 141, "gpu_class": "H200"}


def test_the_small_gpu_shape_transfers_to_the_7b_unscaled() -> None:
    small, big = PRESETS["2b-peaked"], PRESETS["7b-peaked"]
    assert small.gpu_dtype == big.gpu_dtype == "bfloat16" and small.train_steps > 0
    assert small.max_position_embeddings >= 4608  # hfserve_gpu's --max-model-len: 4096-token prompts
    a, b = describe_model("forge:2b-peaked"), describe_model("forge:7b-peaked")
    assert a["params_m"] < b["params_m"] / 4  # another, smaller shape
    assert model_similarity(a, b) >= reuse.MIN_SIMILARITY
    knobs = {"engine": "fast-graphs", "batching": "on", "max_batch_size": 16}
    assert reuse.translate(knobs, {"hardware_desc": H200, "model_desc": a}, {"hardware_desc": H200, "model_desc": b}) == knobs
